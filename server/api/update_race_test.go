package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry"
	"github.com/weirlb/weir/server/resourcewire"
	"github.com/weirlb/weir/server/store"
)

// sharedStore is a Bolt store another replica writes to as well: what
// that replica wrote reaches this one's Follow only once this replica's
// own commit has been refused as stale, so the other write lands between
// this replica's read of a resource and its write of it.
type sharedStore struct {
	*store.Bolt
	mu      sync.Mutex
	others  []otherWrite
	refused chan struct{}
	once    sync.Once
}

type otherWrite struct {
	rev uint64
	ops []store.Op
}

// writeAsOther commits what another replica writes, unseen by this one.
func (s *sharedStore) writeAsOther(t *testing.T, base uint64, kind, key string, obj model.Object) {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	op := store.Op{Kind: kind, Key: key, Value: b}
	rev, err := s.Bolt.Commit(base, op)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.others = append(s.others, otherWrite{rev, []store.Op{op}})
	s.mu.Unlock()
}

func (s *sharedStore) Commit(base uint64, ops ...store.Op) (uint64, error) {
	rev, err := s.Bolt.Commit(base, ops...)
	var stale *store.StaleError
	if errors.As(err, &stale) {
		s.once.Do(func() { close(s.refused) })
	}
	return rev, err
}

func (s *sharedStore) Watch(ctx context.Context, after uint64, fn func(uint64, []store.Op) error) error {
	select {
	case <-s.refused:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	others := slices.Clone(s.others)
	s.mu.Unlock()
	for _, w := range others {
		if w.rev > after {
			if err := fn(w.rev, w.ops); err != nil {
				return err
			}
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// An update that says nothing of status (and no resource_version) races
// the address allocator: the allocator's write lands after the update's
// replica read the service and before its write is decided. The update
// keeps the address the allocator wrote, not the one it read; no address
// flaps.
func TestSpecUpdateKeepsTheAddressAnAllocatorWroteMeanwhile(t *testing.T) {
	assigned := netip.MustParseAddr("198.51.100.10")
	for _, tc := range []struct {
		name   string
		update func(*RegistryService, *weirv1.Service) error
	}{
		{"UpdateService", func(api *RegistryService, p *weirv1.Service) error {
			_, err := api.UpdateService(context.Background(), &weirv1.UpdateServiceRequest{Service: p})
			return err
		}},
		{"Apply", func(api *RegistryService, p *weirv1.Service) error {
			_, err := api.Apply(context.Background(), &weirv1.ApplyRequest{Resources: []*weirv1.ApplyResource{
				{Resource: &weirv1.ApplyResource_Service{Service: p}}}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bolt, err := store.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { bolt.Close() })
			st := &sharedStore{Bolt: bolt, refused: make(chan struct{})}
			reg, err := registry.Open(st)
			if err != nil {
				t.Fatal(err)
			}
			pool := &model.AddressPool{Meta: model.Meta{Name: "pool"},
				Ranges: []model.AddressRange{{First: netip.MustParseAddr("198.51.100.0"), Last: netip.MustParseAddr("198.51.100.255")}}}
			if _, err := reg.Pools.Create(pool); err != nil {
				t.Fatal(err)
			}
			svc := &model.Service{Meta: model.Meta{Namespace: "shop", Name: "web"}, Type: model.LoadBalancer,
				ClusterIPs:            []netip.Addr{netip.MustParseAddr("10.96.0.10")},
				Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: 30080}},
				ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
			if _, err := reg.Services.Create(svc); err != nil {
				t.Fatal(err)
			}
			first := *svc
			first.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.9")}
			if _, err := reg.Services.Update(&first); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			followed := make(chan struct{})
			go func() {
				defer close(followed)
				reg.Follow(ctx, slog.New(slog.DiscardHandler))
			}()
			t.Cleanup(func() { cancel(); <-followed })

			// The allocator, on the leader, moves the service to another
			// address.
			withIP := first
			withIP.LoadBalancerIPs = []netip.Addr{assigned}
			st.writeAsOther(t, reg.Revision(), "services", svc.Key(), &withIP)

			// An operator relabels the service, saying nothing of status.
			p := resourcewire.ServiceToProto(&first)
			p.Status = nil
			p.Metadata = &weirv1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{"team": "shop"}}
			if err := tc.update(NewRegistryService(reg), p); err != nil {
				t.Fatal(err)
			}

			got, err := reg.Services.Get(svc.Key())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.LoadBalancerIPs, withIP.LoadBalancerIPs) || got.Labels["team"] != "shop" {
				t.Errorf("after the update: load-balancer IPs %v, labels %v; want the allocator's %v kept and the update's label",
					got.LoadBalancerIPs, got.Labels, withIP.LoadBalancerIPs)
			}
		})
	}
}
