package cache

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func svc(name, ip string) *weirv1.NodeService {
	return &weirv1.NodeService{Namespace: "shop", Name: name, ClusterIps: []string{ip}}
}

func node(name, addr string) *weirv1.NodeInfo {
	return &weirv1.NodeInfo{Name: name, Addresses: []string{addr}}
}

var t0 = time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)

// summary is a message as "v<version> node=<name> +a +b -c".
func summary(m *Message) string {
	if m == nil {
		return "nothing"
	}
	s := fmt.Sprintf("v%d", m.GetVersion())
	if m.GetFull() {
		s += " full"
	}
	if m.GetNode() != nil {
		s += " node=" + m.GetNode().GetName()
		for _, a := range m.GetNode().GetAddresses() {
			s += "@" + a
		}
	}
	for _, u := range m.GetUpserts() {
		s += " +" + u.GetName()
	}
	for _, r := range m.GetRemovals() {
		s += " -" + r
	}
	return s
}

func TestDeltasCarryWhatChangedForTheNode(t *testing.T) {
	c := New(10, map[string]*weirv1.NodeService{"shop/a": svc("a", "10.96.0.10"), "shop/b": svc("b", "10.96.0.11")},
		map[string]*weirv1.NodeInfo{"n1": node("n1", "192.0.2.11"), "n2": node("n2", "192.0.2.12")}, 100)
	cl := c.Connect("n1")
	defer cl.Close()
	if got := summary(cl.Full()); got != "v10 full node=n1@192.0.2.11 +a +b" {
		t.Fatalf("first state %s", got)
	}
	for _, step := range []struct {
		what  string
		batch Batch
		want  string
	}{
		{"a service changes, one goes, one comes", Batch{Version: 11, Since: t0,
			Services: map[string]*weirv1.NodeService{"shop/a": svc("a", "10.96.0.20"), "shop/b": nil, "shop/c": svc("c", "10.96.0.12")}},
			"v11 +a +c -shop/b"},
		{"a service changes in nothing the agents see", Batch{Version: 12, Since: t0,
			Services: map[string]*weirv1.NodeService{"shop/a": svc("a", "10.96.0.20")}}, "nothing"},
		{"another node changes", Batch{Version: 13, Since: t0, Nodes: map[string]*weirv1.NodeInfo{"n2": node("n2", "192.0.2.22")}}, "nothing"},
		{"the node changes", Batch{Version: 14, Since: t0, Nodes: map[string]*weirv1.NodeInfo{"n1": node("n1", "192.0.2.21")}}, "v14 node=n1@192.0.2.21"},
		{"a service that never was goes", Batch{Version: 15, Since: t0, Services: map[string]*weirv1.NodeService{"shop/x": nil}}, "nothing"},
	} {
		c.Apply(step.batch)
		select {
		case <-cl.Wake():
		default:
			t.Fatalf("%s: the client was not woken", step.what)
		}
		msg, since := cl.Next()
		if got := summary(msg); got != step.want {
			t.Errorf("%s: sent %s, want %s", step.what, got, step.want)
		}
		// Even a batch that sends nothing is covered: the node's
		// programmed version follows the store's.
		if cl.Covered() != step.batch.Version || !since.Equal(t0) {
			t.Errorf("%s: covered %d since %v, want %d since %v", step.what, cl.Covered(), since, step.batch.Version, t0)
		}
	}
}

func TestResume(t *testing.T) {
	c := New(10, map[string]*weirv1.NodeService{"shop/a": svc("a", "10.96.0.10")}, map[string]*weirv1.NodeInfo{"n1": node("n1", "192.0.2.11")}, 1)
	first := c.Connect("n1")
	first.Full()
	c.Apply(Batch{Version: 11, Since: t0, Services: map[string]*weirv1.NodeService{"shop/b": svc("b", "10.96.0.11")}})
	first.Close() // the agent went away having applied 10

	for _, tc := range []struct {
		what string
		from uint64
		prev *Client
		want string // "" when no delta can
	}{
		{"from what it applied, by the client that sent it", 10, first, "v11 +b"},
		{"from what it applied, its last client unknown: the node is sent again", 10, nil, "v11 node=n1@192.0.2.11 +b"},
		{"from now, its last client sent an older version: the node alone", 11, first, "v11 node=n1@192.0.2.11"},
		{"from nothing", 0, nil, ""},
		{"from a version this cache never reached", 12, nil, ""},
		{"from before the cache began", 9, nil, ""},
	} {
		cl := c.Connect("n1")
		msg, ok := cl.Resume(tc.from, tc.prev)
		cl.Close()
		switch {
		case tc.want == "" && ok:
			t.Errorf("%s: resumed with %s; want a whole state", tc.what, summary(msg))
		case tc.want != "" && (!ok || summary(msg) != tc.want):
			t.Errorf("%s: resumed %v with %s; want %s", tc.what, ok, summary(msg), tc.want)
		}
	}
}

// Past its limit the removal log forgets only what every client was sent;
// once forgotten, an agent from before resumes with a whole state.
func TestRemovalsAreKeptForEveryClient(t *testing.T) {
	services := map[string]*weirv1.NodeService{}
	for i := range 4 {
		services[fmt.Sprintf("shop/s%d", i)] = svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.0.%d", 10+i))
	}
	c := New(10, services, nil, 1)
	behind, current := c.Connect("n1"), c.Connect("n2")
	behind.Full()
	current.Full()
	for i := range 3 {
		c.Apply(Batch{Version: uint64(11 + i), Since: t0, Services: map[string]*weirv1.NodeService{fmt.Sprintf("shop/s%d", i): nil}})
		current.Next()
	}
	if msg, _ := behind.Next(); !slices.Equal(msg.GetRemovals(), []string{"shop/s0", "shop/s1", "shop/s2"}) {
		t.Fatalf("the client behind is sent %s; want all three removals", summary(msg))
	}
	behind.Close()
	c.Apply(Batch{Version: 14, Since: t0, Services: map[string]*weirv1.NodeService{"shop/s3": nil}})
	current.Next()
	late := c.Connect("n1")
	defer late.Close()
	if msg, ok := late.Resume(10, behind); ok {
		t.Fatalf("resumed from 10 with %s after its removals were forgotten; want a whole state", summary(msg))
	}
	if msg, ok := late.Resume(14, nil); !ok || summary(msg) != "v14 node=n1" {
		t.Fatalf("resume from the current version: %v %s", ok, summary(msg))
	}
	current.Close()
}

// Clients that connect and take their first state while batches of
// removals go by, the log at its limit, are each sent every removal after
// their first state: none falls between the log's check of what clients
// were sent and its forgetting. Run with -race.
func TestNoClientMissesARemovalWhileJoining(t *testing.T) {
	const services = 200
	all := map[string]*weirv1.NodeService{}
	for i := range services {
		all[fmt.Sprintf("shop/s%d", i)] = svc(fmt.Sprintf("s%d", i), "10.96.0.10")
	}
	c := New(1, all, nil, 1)
	var wg sync.WaitGroup
	errs := make(chan error, services)
	for j := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				cl := c.Connect(fmt.Sprintf("n%d", j))
				first := cl.Full()
				held := map[string]bool{}
				for _, u := range first.GetUpserts() {
					held["shop/"+u.GetName()] = true
				}
				time.Sleep(time.Duration(j) * 10 * time.Microsecond)
				msg, _ := cl.Next()
				for _, r := range msg.GetRemovals() {
					delete(held, r)
				}
				now := c.Version()
				cl.Close()
				// Everything removed by the version the client was last
				// sent is gone from what it holds.
				last := max(first.GetVersion(), msg.GetVersion())
				for key := range held {
					var i int
					fmt.Sscanf(key, "shop/s%d", &i)
					if removedAt := uint64(2 + i); removedAt <= last {
						errs <- fmt.Errorf("a client sent v%d, then v%d (cache at %d), still holds %s, removed at %d", first.GetVersion(), msg.GetVersion(), now, key, removedAt)
						return
					}
				}
			}
		}()
	}
	for i := range services {
		c.Apply(Batch{Version: uint64(2 + i), Since: t0, Services: map[string]*weirv1.NodeService{fmt.Sprintf("shop/s%d", i): nil}})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A batch's messages are shared, not copied: a cached service goes to
// every client as the same message.
func TestAServiceIsEncodedOnceForEveryClient(t *testing.T) {
	c := New(1, nil, nil, 10)
	a, b := c.Connect("n1"), c.Connect("n2")
	defer a.Close()
	defer b.Close()
	a.Full()
	b.Full()
	c.Apply(Batch{Version: 2, Since: t0, Services: map[string]*weirv1.NodeService{"shop/a": svc("a", "10.96.0.10")}})
	ma, _ := a.Next()
	mb, _ := b.Next()
	if len(ma.GetUpserts()) != 1 || ma.GetUpserts()[0] != mb.GetUpserts()[0] || !proto.Equal(ma.GetUpserts()[0], svc("a", "10.96.0.10")) {
		t.Fatalf("sent %s and %s; want one shared message", summary(ma), summary(mb))
	}
}

// Clients making the same step get the same services, built once; a
// client behind, starting from another version, gets its own.
func TestClientsMakingTheSameStepShareItsServices(t *testing.T) {
	c := New(1, map[string]*weirv1.NodeService{"shop/a": svc("a", "10.96.0.10")}, nil, 10)
	a, b, behind := c.Connect("n1"), c.Connect("n2"), c.Connect("n3")
	defer a.Close()
	defer b.Close()
	defer behind.Close()
	if fa, fb := a.Full(), b.Full(); fa.Services != fb.Services || fa.Node == fb.Node {
		t.Fatalf("whole states %s and %s: want the services shared, each its own node", summary(fa), summary(fb))
	}
	behind.Full()
	c.Apply(Batch{Version: 2, Since: t0, Services: map[string]*weirv1.NodeService{"shop/b": svc("b", "10.96.0.11")}})
	a.Next()
	b.Next()
	c.Apply(Batch{Version: 3, Since: t0, Services: map[string]*weirv1.NodeService{"shop/c": svc("c", "10.96.0.12")}})
	ma, _ := a.Next()
	mb, _ := b.Next()
	mbehind, _ := behind.Next()
	if ma.Services != mb.Services || summary(ma) != "v3 +c" {
		t.Fatalf("sent %s and %s; want one shared step", summary(ma), summary(mb))
	}
	if summary(mbehind) != "v3 +b +c" {
		t.Fatalf("the client behind is sent %s; want both changes", summary(mbehind))
	}
}
