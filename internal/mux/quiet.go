package mux

// Quiet reports whether the stream is open both ways, was not reset, and
// holds nothing unread: what a pool of idle streams asks before it hands
// one out again. A stream whose peer half-closed it, reset it, or sent
// bytes nobody asked for is not quiet.
func (st *Stream) Quiet() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.buffered == 0 && !st.rfin && !st.wfin && !st.closed && st.err == nil
}
