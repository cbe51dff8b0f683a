package aggregator

import (
	"fmt"
	"testing"
)

// BenchmarkFold is the per-record cost of folding a small JSON record
// with a key field and four aggregates (the replay rate's ceiling on one
// core).
func BenchmarkFold(b *testing.B) {
	p := mustCompile(b, testSpec(0, "page"))
	st := NewState(p, 1024)
	vals := make([][]byte, 1024)
	for i := range vals {
		vals[i] = fmt.Appendf(nil, `{"page": "/p%d", "amount": %d.25, "user": {"id": "u%d", "name": "x"}, "tags": ["a", "b"]}`, i%512, i, i%97)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		st.Fold(nil, vals[i%len(vals)], 0)
	}
}
