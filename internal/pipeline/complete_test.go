package pipeline

import (
	"slices"
	"testing"
)

func TestCompleteWritesWhatArrivedTogether(t *testing.T) {
	outcomes := make(chan int, 10)
	for i := range 7 {
		outcomes <- i
	}
	close(outcomes)
	w := NewWindow(10, 5)
	var writes [][]int
	Complete(outcomes, w, 3, func(b []int) { writes = append(writes, slices.Clone(b)) })
	want := [][]int{{0, 1, 2}, {3, 4, 5}, {6}}
	if !slices.EqualFunc(writes, want, slices.Equal) {
		t.Fatalf("writes %v, want %v", writes, want)
	}
	select {
	case <-w.Room():
	default:
		t.Fatal("no signal after the writes")
	}
}

func TestCompleteSignalsAfterEachWrite(t *testing.T) {
	outcomes := make(chan int)
	w := NewWindow(10, 5)
	written := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Complete(outcomes, w, 10, func([]int) {
			select {
			case <-w.Room():
				t.Error("signalled before the write ended")
			default:
			}
			written <- struct{}{}
		})
	}()
	for range 2 {
		outcomes <- 1
		<-written
		for i := 0; ; i++ { // the signal follows the write at once
			select {
			case <-w.Room():
			default:
				if i < 1e6 {
					continue
				}
				t.Fatal("no signal after a write")
			}
			break
		}
	}
	close(outcomes)
	<-done
}
