package main

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/weirlb/weir/server/api"
)

// report prints the end-to-end latencies of the changes and where the
// time went.
func report(cfg config, changes []*change, sims []*simAgent, reals []*realNode, before, after scrapes) {
	var write, simulated, committed, shown, serverSaw, everyNode, everyNodeFromCall, waited durations
	inexact := 0
	for _, ch := range changes {
		write = append(write, ch.accepted.Sub(ch.called))
		waited = append(waited, ch.programmed.Sub(ch.accepted))
		var slowest time.Duration
		for _, a := range sims {
			at, _ := a.receivedAt(ch.revision)
			simulated = append(simulated, at.Sub(ch.accepted))
			slowest = max(slowest, at.Sub(ch.accepted))
		}
		for _, r := range reals {
			at, exact, _ := r.committedAt(ch.revision)
			if !exact {
				inexact++
			}
			committed = append(committed, at.Sub(ch.accepted))
			slowest = max(slowest, at.Sub(ch.accepted))
			if at, latency, ok := r.shownAt(ch.revision); ok {
				shown = append(shown, at.Sub(ch.accepted))
				if latency > 0 {
					serverSaw = append(serverSaw, latency)
				}
			}
		}
		everyNode = append(everyNode, slowest)
		everyNodeFromCall = append(everyNodeFromCall, slowest+ch.accepted.Sub(ch.called))
	}
	spacing := fmt.Sprintf("each %v after the previous write's answer, to go out alone", cfg.gap)
	if cfg.gap == 0 {
		spacing = "back to back"
	}
	fmt.Printf("\n%d single-endpoint changes, %s; %d services, %d agents (%d real nodes, %d simulated), min-sync-period %v\n",
		len(changes), spacing, cfg.services, cfg.agents, len(reals), len(sims), cfg.minSync)
	fmt.Println("from the write accepted (UpdateEndpointSlice returned) to:")
	row := func(what string, d durations) { fmt.Printf("  %-46s %v\n", what, d) }
	row("a simulated agent received the state", simulated)
	row("a real node's kernel committed it", committed)
	row("every node has it (slowest agent per change)", everyNode)
	row("WaitProgrammed said every node had it", waited)
	row("every node has it, from the write's call", everyNodeFromCall)
	row("the status stream showed a real node applied", shown)
	fmt.Println("  a real node's kernel: the agent's own timestamp when its apply returned (weir_sync_proxy_rules_last_timestamp_seconds,")
	fmt.Println("    read at once after the status stream showed the version applied; the same host clock as this program).")
	if inexact > 0 {
		fmt.Printf("    %d of those samples are upper bounds: the agent applied another state between two readings.\n", inexact)
	}
	fmt.Printf("  the status stream: when WatchNodeStatuses delivered it, an upper bound: the server waits %v after a change before it sends, to gather more.\n", api.WatchStatusPeriod)
	fmt.Println("  every time but one starts when the write's answer reached this program; the server starts sending before")
	fmt.Println("    it answers, so an agent can have a state before its write returns. From the call instead: an upper bound.")

	fmt.Println("\nwhere the time goes:")
	row("the write itself (before \"accepted\")", write)
	states := after.agents[0]["weir_sync_proxy_rules_duration_seconds_count"] - before.agents[0]["weir_sync_proxy_rules_duration_seconds_count"]
	fmt.Printf("  %-46s %s's agent applied %.0f states for the %d changes (a lone change goes out at once; a change within\n",
		"coalescing", reals[0].node.Name, states, len(changes))
	fmt.Printf("  %-46s %v of the last round waits for the rest of that period)\n", "", cfg.minSync)
	row("server to agent receipt (simulated agents)", simulated)
	fmt.Println("    the server working out each node's delta and encoding it, TLS across the lab's veths, and this program")
	fmt.Println("    decoding it among all the simulated agents on the same CPUs")
	var apply histogram
	for i := range after.agents {
		apply = apply.add(histogramOf(after.agents[i], "weir_sync_proxy_rules_duration_seconds").since(histogramOf(before.agents[i], "weir_sync_proxy_rules_duration_seconds")), 1)
	}
	fmt.Printf("  %-46s %v\n", "agent apply (real agents)", apply)
	fmt.Println("    weir_sync_proxy_rules_duration_seconds over the changes: the kernel transaction (netlink or nft) and building it;")
	fmt.Println("    not the real agent's receipt, decoding and merging of the state")
	row("total to a real node's kernel", committed)
	if apply.count > 0 && len(simulated) > 0 {
		fmt.Printf("  %-46s %v (total's median - receipt's median - mean apply: the real agent's own receipt, decoding, merging, waiting for a CPU)\n",
			"the rest", round(median(committed)-median(simulated)-apply.mean()))
	}
	programming := histogramOf(after.server, "weir_network_programming_duration_seconds").since(histogramOf(before.server, "weir_network_programming_duration_seconds"))
	fmt.Printf("  %-46s %v\n", "server: weir_network_programming_duration", programming)
	fmt.Printf("    from the server accepting a change to an agent's ACK reaching it, over all %d agents (%d simulated, which ACK on receipt)\n",
		cfg.agents, len(sims))
	row("server: real nodes' programming_latency", serverSaw)
	fmt.Println("    the same for the real nodes alone (NodeStatus.programming_latency, from the status stream): the server's")
	fmt.Println("    acceptance to their ACK, sent once the kernel committed")
}

func median(d durations) time.Duration {
	s := slices.Sorted(slices.Values(d))
	return s[len(s)/2]
}

// gcPauses is what the collector of this program (the simulated agents)
// stopped it for while the changes were made.
type gcPauses struct {
	cycles         uint32
	total, longest time.Duration
}

func gcOf(before, after *runtime.MemStats) gcPauses {
	g := gcPauses{cycles: after.NumGC - before.NumGC, total: time.Duration(after.PauseTotalNs - before.PauseTotalNs)}
	for n := before.NumGC + 1; n <= after.NumGC && n+256 > after.NumGC; n++ {
		g.longest = max(g.longest, time.Duration(after.PauseNs[(n+255)%256]))
	}
	return g
}

// reportStalls shows whether the slowest changes were late for every
// agent (the whole process or machine stalled: the median receipt is
// late too) or for a few (stragglers: the median is early, the last
// late), and what the collectors stopped.
func reportStalls(changes []*change, sims []*simAgent, before, after scrapes, own gcPauses) {
	type late struct {
		ch       *change
		receipts durations
		slowest  time.Duration
	}
	var all []late
	for _, ch := range changes {
		l := late{ch: ch}
		for _, a := range sims {
			at, _ := a.receivedAt(ch.revision)
			l.receipts = append(l.receipts, at.Sub(ch.accepted))
		}
		slices.Sort(l.receipts)
		if len(l.receipts) > 0 {
			l.slowest = l.receipts[len(l.receipts)-1]
		}
		all = append(all, l)
	}
	slices.SortFunc(all, func(a, b late) int { return cmp.Compare(b.slowest, a.slowest) })
	fmt.Println("\nthe slowest changes, by their last simulated agent (a late median: everything stalled; an early one: stragglers):")
	for _, l := range all[:min(5, len(all))] {
		n := len(l.receipts)
		if n == 0 {
			continue
		}
		over := 0
		for _, d := range l.receipts {
			if d > 100*time.Millisecond {
				over++
			}
		}
		fmt.Printf("  revision %d: p50 %v  p90 %v  last %v; %d of %d agents after 100 ms; the write took %v\n",
			l.ch.revision, round(l.receipts[n/2]), round(l.receipts[n*9/10]), round(l.receipts[n-1]), over, n,
			round(l.ch.accepted.Sub(l.ch.called)))
	}
	fmt.Printf("the server's /metrics page: %d series, read in %v before the changes and %v after\n",
		len(after.server), round(before.serverTook), round(after.serverTook))
	fmt.Printf("the server's CPU per change: %v (process_cpu_seconds_total over the changes, gaps included)\n",
		round(seconds((after.server["process_cpu_seconds_total"]-before.server["process_cpu_seconds_total"])/float64(max(1, len(changes))))))
	fmt.Println("garbage collection while the changes were made:")
	fmt.Printf("  %-46s %d cycles, %v stopped, longest %v\n", "this program (the simulated agents)", own.cycles, round(own.total), round(own.longest))
	cycles := after.server["go_gc_duration_seconds_count"] - before.server["go_gc_duration_seconds_count"]
	paused := seconds(after.server["go_gc_duration_seconds_sum"] - before.server["go_gc_duration_seconds_sum"])
	fmt.Printf("  %-46s %.0f cycles, %v stopped, longest recent %v\n", "weir-server", cycles, round(paused),
		round(seconds(after.server[`go_gc_duration_seconds{quantile="1"}`])))
}
