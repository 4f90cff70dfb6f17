package inbox

import (
	"runtime"
	"strconv"
	"testing"
)

// BenchmarkFilterMemory fills a filter of DefaultFilterCapacity keys and
// reports its memory (the bit sets, and the heap it took) and the
// false-positive rate measured on as many keys it never saw.
//
//	go test -run '^$' -bench BenchmarkFilterMemory -benchtime 1x ./inbox
func BenchmarkFilterMemory(b *testing.B) {
	const n = DefaultFilterCapacity
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f := newFilter(n, DefaultFalsePositiveRate)
		for i := range n {
			f.add(strconv.Itoa(i))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		falsePositives := 0
		for i := n; i < 2*n; i++ {
			if f.mayContain(strconv.Itoa(i)) {
				falsePositives++
			}
		}
		b.ReportMetric(float64(f.bytes())/(1<<20), "MiB-bitsets")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB-heap")
		b.ReportMetric(float64(falsePositives)/float64(n)*100, "%false-positive")
		runtime.KeepAlive(f)
	}
}

// The filter keeps two generations: after a generation's worth of new
// keys, the previous generation's keys are still found; after two, they
// are forgotten.
func TestFilterGenerations(t *testing.T) {
	f := newFilter(100, 1e-9)
	f.add("old")
	for i := range 99 {
		f.add("a" + strconv.Itoa(i))
	}
	for i := range 100 {
		f.add("b" + strconv.Itoa(i))
	}
	if !f.mayContain("old") {
		t.Fatal("a key of the previous generation was forgotten")
	}
	for i := range 100 {
		f.add("c" + strconv.Itoa(i))
	}
	if f.mayContain("old") {
		t.Fatal("a key two generations old is still there")
	}
}
