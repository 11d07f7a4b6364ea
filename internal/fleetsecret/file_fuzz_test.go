package fleetsecret

import (
	"strings"
	"testing"

	"github.com/switchboard-relay/switchboard/internal/secret"
)

// FuzzParseFile feeds arbitrary file contents to parseFile: no
// panic; what it accepts is 1 to MaxSecrets secrets of at least
// secret.MinBytes each; an error never quotes the file.
func FuzzParseFile(f *testing.F) {
	f.Add([]byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"))
	f.Add([]byte("# comment\n00112233445566778899aabbccddeeff\n\nMDEyMzQ1Njc4OWFiY2RlZg\n"))
	f.Add([]byte("\r\n \t"))
	f.Add([]byte("zz"))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := parseFile(data)
		if err != nil {
			if len(data) > 8 && containsLine(err.Error(), data) {
				t.Fatalf("the error quotes the file: %v", err)
			}
			return
		}
		if len(keys) == 0 || len(keys) > MaxSecrets {
			t.Fatalf("%d secrets", len(keys))
		}
		for _, k := range keys {
			if len(k) < secret.MinBytes {
				t.Fatalf("a secret of %d bytes", len(k))
			}
		}
	})
}

// containsLine reports whether msg holds a whole non-trivial line of data.
func containsLine(msg string, data []byte) bool {
	start := 0
	for i := 0; i <= len(data); i++ {
		if i == len(data) || data[i] == '\n' {
			if line := string(data[start:i]); len(line) > 8 && strings.Contains(msg, line) {
				return true
			}
			start = i + 1
		}
	}
	return false
}
