package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// metrics are one /metrics page in Prometheus's text format: each series,
// its name and labels as written, to its value. The few this bench reads
// need no more than that.
type metrics map[string]float64

// scrape reads http://addr/metrics through client.
func scrape(ctx context.Context, client *http.Client, addr string) (metrics, error) {
	page, err := get(ctx, client, "http://"+addr+"/metrics")
	if err != nil {
		return nil, err
	}
	m := metrics{}
	lines := bufio.NewScanner(bytes.NewReader(page))
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// No timestamps in client_golang's output: the value is last.
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m, lines.Err()
}

// histogram is one Prometheus histogram: cumulative buckets by upper bound.
type histogram struct {
	buckets    []bucket
	sum, count float64
}

type bucket struct{ le, count float64 }

// histogramOf reads the histogram name from m.
func histogramOf(m metrics, name string) histogram {
	h := histogram{sum: m[name+"_sum"], count: m[name+"_count"]}
	prefix := name + `_bucket{le="`
	for series, v := range m {
		if le, ok := strings.CutPrefix(series, prefix); ok {
			if bound, err := strconv.ParseFloat(strings.TrimSuffix(le, `"}`), 64); err == nil {
				h.buckets = append(h.buckets, bucket{bound, v})
			}
		}
	}
	slices.SortFunc(h.buckets, func(a, b bucket) int { return compareFloat(a.le, b.le) })
	return h
}

func compareFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// add is h with o's observations added sign times (-1 takes an earlier
// reading away); both have the same buckets, or h has none yet.
func (h histogram) add(o histogram, sign float64) histogram {
	out := histogram{sum: h.sum + sign*o.sum, count: h.count + sign*o.count, buckets: slices.Clone(h.buckets)}
	if out.buckets == nil {
		for _, b := range o.buckets {
			out.buckets = append(out.buckets, bucket{b.le, 0})
		}
	}
	for i, b := range o.buckets {
		if i < len(out.buckets) && out.buckets[i].le == b.le {
			out.buckets[i].count += sign * b.count
		}
	}
	return out
}

// since is what was observed between an earlier reading and h.
func (h histogram) since(earlier histogram) histogram { return h.add(earlier, -1) }

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear within the bucket that holds it.
func (h histogram) quantile(q float64) time.Duration {
	rank := q * h.count
	lower, below := 0.0, 0.0
	for _, b := range h.buckets {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return seconds(lower)
			}
			return seconds(lower + (b.le-lower)*(rank-below)/(b.count-below))
		}
		lower, below = b.le, b.count
	}
	return seconds(lower)
}

func (h histogram) mean() time.Duration { return seconds(h.sum / h.count) }

// String is the mean (exact) and the median and p99 (within a bucket).
func (h histogram) String() string {
	if h.count == 0 {
		return "no observations"
	}
	return fmt.Sprintf("mean %v, p50 ~%v, p99 ~%v (%.0f observations; quantiles interpolated within buckets that double from 1 ms)",
		round(h.mean()), round(h.quantile(0.5)), round(h.quantile(0.99)), h.count)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// round keeps a duration readable: 100 µs steps.
func round(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

// durations are samples of one latency.
type durations []time.Duration

// String is the median, p99 and max, and how many samples.
func (d durations) String() string {
	if len(d) == 0 {
		return "no samples"
	}
	s := slices.Sorted(slices.Values(d))
	q := func(p int) time.Duration { return round(s[min(len(s)-1, len(s)*p/100)]) }
	return fmt.Sprintf("p50 %8v  p99 %8v  max %8v  (%d samples)", q(50), q(99), round(s[len(s)-1]), len(s))
}
