package node

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
)

// TestPromoterBatches: what is asked while batches are in flight goes out
// in the next batches, whole up to promoteBatch, two of them in flight at
// once; their then steps run one after another in the order the batches
// were taken, whichever batch's writes end first. Nothing is run twice or
// lost, and close waits for what runs and runs no more.
func TestPromoterBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sizes []int
		var ran []string // the devices, in the order their then steps ran
		release := map[string]chan struct{}{}
		gate := func(first string) chan struct{} {
			mu.Lock()
			defer mu.Unlock()
			if release[first] == nil {
				release[first] = make(chan struct{})
			}
			return release[first]
		}
		p := &promoter{run: func(batch []promotion) func() {
			mu.Lock()
			sizes = append(sizes, len(batch))
			mu.Unlock()
			<-gate(batch[0].device)
			return func() {
				mu.Lock()
				defer mu.Unlock()
				for _, pr := range batch {
					ran = append(ran, pr.device)
				}
			}
		}}
		p.add(promotion{device: "d0"})
		synctest.Wait() // d0's batch is in flight
		want := promoteBatch + 10
		for i := 1; i <= want; i++ {
			p.add(promotion{device: fmt.Sprintf("d%d", i)})
		}
		close(gate("d0"))
		synctest.Wait() // the next two batches are in flight
		mu.Lock()
		inFlight := slices.Clone(sizes)
		mu.Unlock()
		if !slices.Equal(inFlight, []int{1, promoteBatch, 10}) && !slices.Equal(inFlight, []int{1, 10, promoteBatch}) {
			t.Fatalf("batches taken %v, want 1, then %d and 10 at once", inFlight, promoteBatch)
		}
		close(gate(fmt.Sprintf("d%d", promoteBatch+1))) // the later batch's writes end first
		synctest.Wait()
		mu.Lock()
		if len(ran) != 1 {
			t.Errorf("%d promotions ran before the earlier batch's writes ended, want only d0's", len(ran))
		}
		mu.Unlock()
		close(gate("d1"))
		synctest.Wait()
		p.close()
		p.add(promotion{device: "late"})
		synctest.Wait()

		mu.Lock()
		defer mu.Unlock()
		if len(ran) != want+1 {
			t.Fatalf("%d promotions ran, want %d", len(ran), want+1)
		}
		for i, d := range ran {
			if d != fmt.Sprintf("d%d", i) {
				t.Fatalf("promotion %d is %s; all: %s…", i, d, strings.Join(ran[:min(len(ran), 5)], " "))
			}
		}
	})
}
