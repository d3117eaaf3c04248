package replicas

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/weirlb/weir/internal/report"
	"github.com/weirlb/weir/server/agentsync"
	"github.com/weirlb/weir/server/observed"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// sharedBefore is a node's status as the replicas before the report
// types left the transport published it (captured from that version's
// encodeStatus): replicas upgrade one by one, so both must read it alike.
const sharedBefore = `{"Replica":"r1","Status":{"Node":"node1","Connected":true,"SentVersion":7,"AppliedVersion":6,"Covered":5,"ProgrammingLatency":3000000,"LastError":"boom","LastErrorVersion":4,"LastSeen":"2026-11-25T01:02:03Z","Health":{"HealthzCode":200,"LivezCode":200,"LastUpdated":"2026-11-25T01:02:00Z","NodeEligible":true},"LastSync":2000000,"Services":{"shop/web":{"LocalReady":2,"LocalServing":2,"LocalTerminating":0,"HealthCheckNodePort":32000,"HealthCheckCode":200,"HealthCheckError":""}},"BGPSessions":[{"peer_address":"192.0.2.1","peer_asn":64500,"state":"established","established_since":{"seconds":1795564800,"nanos":5},"last_error":"x","families":[{"family":"ipv4","negotiated":true,"sent":3,"received":1,"accepted":1}]}],"BGPAnnouncements":[{"prefix":"203.0.113.10/32","next_hop":"192.0.2.11","weight":2}]}}`

func TestSharedStatusFormatIsUnchanged(t *testing.T) {
	want := observed.Node{Node: "node1", Connected: true, SentVersion: 7, AppliedVersion: 6, Covered: 5,
		ProgrammingLatency: 3 * time.Millisecond, LastError: "boom", LastErrorVersion: 4,
		LastSeen: time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC),
		Health:   observed.Health{HealthzCode: 200, LivezCode: 200, NodeEligible: true, LastUpdated: time.Date(2026, 11, 25, 1, 2, 0, 0, time.UTC)},
		LastSync: 2 * time.Millisecond,
		Services: map[string]observed.Service{"shop/web": {LocalReady: 2, LocalServing: 2, HealthCheckNodePort: 32000, HealthCheckCode: 200}},
		BGPSessions: []report.BGPSession{{PeerAddress: mustAddr("192.0.2.1"), PeerASN: 64500, State: "established",
			Since: time.Date(2026, 11, 25, 0, 0, 0, 5, time.UTC), LastError: "x",
			Families: []report.BGPFamily{{Name: "ipv4", Negotiated: true, Sent: 3, Received: 1, Accepted: 1}}}},
		BGPAnnouncements: []report.BGPAnnouncement{{Prefix: mustPrefix("203.0.113.10/32"), NextHop: mustAddr("192.0.2.11"), Weight: 2}},
	}
	b, cut := encodeStatus("r1", want)
	if cut {
		t.Fatal("a small status was cut")
	}
	var gotWire, beforeWire any
	if err := json.Unmarshal(b, &gotWire); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(sharedBefore), &beforeWire); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(beforeWire, gotWire); d != "" {
		t.Errorf("a replica now publishes what an older one reads differently (-before +now):\n%s", d)
	}
	hub := agentsync.New(registrytest.Open(t), agentsync.Config{})
	setRemote(Config{Name: "r2", Hub: hub}, "node1", []byte(sharedBefore))
	got := hub.Status()
	if len(got) != 1 {
		t.Fatalf("the older replica's status was not read: %v", got)
	}
	if d := cmp.Diff(want, got[0], cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) }), cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("an older replica's status reads differently (-want +got):\n%s", d)
	}
}

func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
