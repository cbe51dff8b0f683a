package main

import (
	"math"
	"math/bits"
	"time"
)

// histogram is a log-linear (HDR-like) latency histogram over nanoseconds:
// exact below 32ns, then 32 sub-buckets per power of two (≤ 3.2% error).
// Fixed size (~15 KiB), O(1) record, mergeable.
type histogram struct {
	counts [histBuckets]uint64
	total  uint64
	sum    float64
	min    uint64
	max    uint64
}

const (
	histSubBits = 5
	histSub     = 1 << histSubBits
	histBuckets = (64-histSubBits)*histSub + histSub
)

func histIndex(v uint64) int {
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1
	return (e+1)*histSub + int(v>>uint(e)) - histSub
}

// histRange returns the smallest and largest value of bucket i.
func histRange(i int) (lo, hi uint64) {
	if i < histSub {
		return uint64(i), uint64(i)
	}
	e := i/histSub - 1
	m := uint64(i%histSub + histSub)
	lo = m << uint(e)
	return lo, lo + (uint64(1) << uint(e)) - 1
}

func (h *histogram) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histIndex(v)]++
	if h.total == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.total++
	h.sum += float64(v)
}

func (h *histogram) merge(o *histogram) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.total += o.total
	h.sum += o.sum
}

// quantile returns the value at quantile q (0..1): the midpoint of the
// bucket holding the ceil(q*total)-th value, clamped to [min, max].
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	rank = min(max(rank, 1), h.total)
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			lo, hi := histRange(i)
			v := lo + (hi-lo)/2
			v = min(max(v, h.min), h.max)
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}

func (h *histogram) mean() time.Duration {
	if h.total == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.total))
}
