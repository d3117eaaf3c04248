package bgpspeaker

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirlb/weir/internal/bfd"
	"github.com/weirlb/weir/internal/report"
)

// Per peer (and family): bounded by the routers a speaker peers with.
var (
	sessionUp = prometheus.NewDesc("weir_bgp_session_up",
		"1 when the BGP session with the peer is established, else 0.", []string{"peer"}, nil)
	prefixes = prometheus.NewDesc("weir_bgp_prefixes",
		"Prefixes on an established session, by family and direction: sent to the peer, received from it, accepted of those.", []string{"peer", "family", "direction"}, nil)
	bfdUp = prometheus.NewDesc("weir_bfd_session_up",
		"1 when the BFD session with the peer is Up, else 0.", []string{"peer"}, nil)
	bfdFlaps = prometheus.NewDesc("weir_bfd_session_flaps_total",
		"Times the BFD session with the peer went down after Up: its detection time, or the peer's Down (not its AdminDown).", []string{"peer"}, nil)
)

// Collector exports the speaker's sessions, read from GoBGP at each
// scrape.
func (g *GoBGP) Collector() prometheus.Collector { return collector{g} }

type collector struct{ g *GoBGP }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionUp
	ch <- prefixes
	ch <- bfdUp
	ch <- bfdFlaps
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.g.BFD() {
		up := 0.0
		if s.State == bfd.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(bfdUp, prometheus.GaugeValue, up, s.Peer.String())
		ch <- prometheus.MustNewConstMetric(bfdFlaps, prometheus.CounterValue, float64(s.Flaps), s.Peer.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sessions, err := c.g.Sessions(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sessionUp, err)
		return
	}
	for _, s := range sessions {
		peer := s.PeerAddress.String()
		up := 0.0
		if s.State == report.BGPEstablished {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(sessionUp, prometheus.GaugeValue, up, peer)
		if up == 0 {
			continue
		}
		for _, f := range s.Families {
			fam := string(f.Name)
			ch <- prometheus.MustNewConstMetric(prefixes, prometheus.GaugeValue, float64(f.Sent), peer, fam, "sent")
			ch <- prometheus.MustNewConstMetric(prefixes, prometheus.GaugeValue, float64(f.Received), peer, fam, "received")
			ch <- prometheus.MustNewConstMetric(prefixes, prometheus.GaugeValue, float64(f.Accepted), peer, fam, "accepted")
		}
	}
}
