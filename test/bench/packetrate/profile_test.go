package main

import "testing"

// A perf report's lines as perf 6.1 prints them with -n --sort sym.
func TestClassifySamples(t *testing.T) {
	report := []byte(`# Samples: 10K of event 'cpu-clock:ppp'
#
# Overhead       Samples  Symbol
# ........  ............  ......
#
    17.46%          1745  [k] pv_native_safe_halt
     1.53%           541  [k] nft_do_chain
     1.20%           120  [k] fib_table_lookup
     0.39%           138  [k] nft_rhash_lookup
     0.19%            19  [k] pipapo_get_avx2
     0.08%            30  [k] jhash
     0.10%            10  [.] runtime.mallocgc
     0.05%             5  [k] __nft_trace_packet
`)
	nft, busy := classifySamples(report)
	if nft != 541+138+19+30+5 || busy != 541+120+138+19+30+10+5 {
		t.Fatalf("nft %d, busy %d", nft, busy)
	}
}
