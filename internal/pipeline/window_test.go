package pipeline

import "testing"

func TestNext(t *testing.T) {
	w := NewWindow(110, 100) // 10 workers, batches of 100
	if got := w.Next(0, 10); got != 100 {
		t.Fatalf("empty window: claim %d, want a full batch", got)
	}
	w.Claimed(100)
	if got := w.Next(90, 0); got != 0 {
		t.Fatalf("10 free: claim %d, want to wait", got)
	}
	for range 60 {
		w.Handled()
	}
	if got := w.Next(30, 0); got != 0 {
		t.Fatalf("70 free, 30 waiting for busy workers: claim %d, want to wait for a full batch", got)
	}
	if got := w.Next(0, 3); got != 70 {
		t.Fatalf("70 free, 3 idle workers with nothing: claim %d, want 70", got)
	}
	for range 40 {
		w.Handled()
	}
	if got := w.Next(0, 0); got != 100 {
		t.Fatalf("all free: claim %d, want 100", got)
	}
	select {
	case <-w.Room():
	default:
		t.Fatal("Handled did not signal Room")
	}
	if w.Held() != 0 {
		t.Fatalf("held %d, want 0", w.Held())
	}
}

func TestCapacityAtLeastABatch(t *testing.T) {
	w := NewWindow(1, 5)
	if got := w.Next(0, 1); got != 5 {
		t.Fatalf("claim %d, want 5", got)
	}
}
