package api

import (
	"context"
	"io"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// Bad input is refused as InvalidArgument naming the field by its full
// path in the request, for every kind, and nothing is stored.
func TestBadFieldsAreNamedAndStoreNothing(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	meta := func(name string) *weirv1.ObjectMeta { return &weirv1.ObjectMeta{Name: name} }
	for _, tc := range []struct {
		name  string
		write func() error
		field string
		list  func() (int, error)
	}{
		{"a node address", func() error {
			_, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n1", "192.0.2.300")})
			return err
		}, "node.addresses[0]", e.countNodes},
		{"a node name", func() error {
			_, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("N_1", "192.0.2.1")})
			return err
		}, "node.metadata.name", e.countNodes},
		{"a pool's range", func() error {
			_, err := e.registry.CreateAddressPool(ctx, &weirv1.CreateAddressPoolRequest{AddressPool: &weirv1.AddressPool{Metadata: meta("p"), Addresses: []string{"203.0.113.0/33"}}})
			return err
		}, "address_pool.addresses[0]", func() (int, error) {
			r, err := e.registry.ListAddressPools(ctx, &weirv1.ListAddressPoolsRequest{})
			return len(r.GetAddressPools()), err
		}},
		{"a peer's address", func() error {
			_, err := e.registry.CreateBgpPeer(ctx, &weirv1.CreateBgpPeerRequest{BgpPeer: &weirv1.BgpPeer{Metadata: meta("r"), Address: "router", Asn: 65000}})
			return err
		}, "bgp_peer.address", func() (int, error) {
			r, err := e.registry.ListBgpPeers(ctx, &weirv1.ListBgpPeersRequest{})
			return len(r.GetBgpPeers()), err
		}},
		{"a service CIDR", func() error {
			_, err := e.registry.CreateServiceCidr(ctx, &weirv1.CreateServiceCidrRequest{ServiceCidr: &weirv1.ServiceCidr{Metadata: meta("c"), Cidrs: []string{"10.0.0.0/40"}}})
			return err
		}, "service_cidr.cidrs[0]", func() (int, error) {
			r, err := e.registry.ListServiceCidrs(ctx, &weirv1.ListServiceCidrsRequest{})
			return len(r.GetServiceCidrs()), err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantField(t, tc.name, tc.write(), tc.field)
			if n, err := tc.list(); err != nil || n != 0 {
				t.Errorf("after a refused write: %d stored, %v", n, err)
			}
		})
	}
}

func (e *edge) countNodes() (int, error) {
	r, err := e.registry.ListNodes(context.Background(), &weirv1.ListNodesRequest{})
	return len(r.GetNodes()), err
}

// A write that carries a resource_version happens only if nothing changed
// the resource since (Aborted otherwise, the stored one kept); a name is
// created once; a missing resource is NotFound for every verb.
func TestVersionsGuardWrites(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	created, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n1", "192.0.2.11")})
	if err != nil {
		t.Fatal(err)
	}
	v1 := created.GetNode().GetMetadata().GetResourceVersion()
	if v1 == "" || created.GetNode().GetMetadata().GetSource() != "native" {
		t.Fatalf("created %v: want a resource_version and the native source", created.GetNode().GetMetadata())
	}
	_, err = e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n1", "192.0.2.12")})
	wantCode(t, "a second create", err, codes.AlreadyExists, "")

	up := node("n1", "192.0.2.13")
	up.Metadata.ResourceVersion = v1
	updated, err := e.registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: up})
	if err != nil {
		t.Fatal(err)
	}
	v2 := updated.GetNode().GetMetadata().GetResourceVersion()
	if revision(t, v2) <= revision(t, v1) {
		t.Errorf("resource_version %s after %s: want it to grow", v2, v1)
	}

	stale := node("n1", "192.0.2.14")
	stale.Metadata.ResourceVersion = v1
	_, err = e.registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: stale})
	wantCode(t, "an update from a stale version", err, codes.Aborted, "")
	_, err = e.registry.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "n1", ResourceVersion: v1})
	wantCode(t, "a delete from a stale version", err, codes.Aborted, "")
	_, err = e.registry.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "n1", ResourceVersion: "latest"})
	wantCode(t, "a delete with a version that is not one", err, codes.InvalidArgument, "resource_version:")
	got, err := e.registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "n1"})
	if err != nil || got.GetNode().GetAddresses()[0] != "192.0.2.13" || got.GetNode().GetMetadata().GetResourceVersion() != v2 {
		t.Fatalf("after refused writes: %v, %v; want the update's node at %s", got.GetNode(), err, v2)
	}

	del, err := e.registry.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "n1", ResourceVersion: v2})
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 the deprecated resource_version is still filled
	if revision(t, del.GetResourceVersion()) != del.GetRevision() || del.GetRevision() <= revision(t, v2) {
		t.Errorf("delete at %q (revision %d) after %s: want one revision, later", del.GetResourceVersion(), del.GetRevision(), v2) //lint:ignore SA1019 as above
	}
	for what, err := range map[string]error{
		"get":    second(e.registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "n1"})),
		"update": second(e.registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: node("n1", "192.0.2.11")})),
		"delete": second(e.registry.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "n1"})),
		"drain":  second(e.registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "n1"})),
	} {
		wantCode(t, what+" of a deleted node", err, codes.NotFound, "")
	}
}

// revision reads a resource_version, which is a store revision.
func revision(t *testing.T, v string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("resource_version %q: %v", v, err)
	}
	return n
}

func second[T any](_ T, err error) error { return err }

// validate_only answers as the write would, and writes nothing.
func TestValidateOnlyWritesNothing(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	r, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n1", "192.0.2.11"), ValidateOnly: true})
	if err != nil || r.GetNode().GetAddresses()[0] != "192.0.2.11" {
		t.Fatalf("validate-only create: %v, %v", r, err)
	}
	_, err = e.registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "n1"})
	wantCode(t, "after a validate-only create", err, codes.NotFound, "")
	if _, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n1", "192.0.2.11")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: node("n1", "192.0.2.99"), ValidateOnly: true}); err != nil {
		t.Fatal(err)
	}
	got, _ := e.registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "n1"})
	if a := got.GetNode().GetAddresses(); len(a) != 1 || a[0] != "192.0.2.11" {
		t.Errorf("after a validate-only update: %v", a)
	}
	_, err = e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n2", "192.0.2.300"), ValidateOnly: true})
	wantField(t, "a bad validate-only create", err, "node.addresses[0]")
}

// An update of a service may be told to replace only the addresses it
// was given; any other mask path is refused, naming its place.
func TestUpdateMaskPaths(t *testing.T) {
	e := startEdge(t)
	svc := &weirv1.Service{Metadata: &weirv1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: &weirv1.ServiceSpec{Type: weirv1.ServiceType_SERVICE_TYPE_CLUSTER_IP, ClusterIps: []string{"10.96.0.10"},
			Ports: []*weirv1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := e.registry.CreateService(context.Background(), &weirv1.CreateServiceRequest{Service: svc}); err != nil {
		t.Fatal(err)
	}
	_, err := e.registry.UpdateService(context.Background(), &weirv1.UpdateServiceRequest{Service: svc,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"status.load_balancer_ips", "spec.ports"}}})
	wantCode(t, "a second mask path", err, codes.InvalidArgument, "update_mask.paths[1]:")
}

// A drain's timeout is checked at the edge; a drain says whether the node
// was drained already, and an uncordon takes it back.
func TestDrainAndUncordon(t *testing.T) {
	e := startEdge(t)
	ctx := context.Background()
	if _, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: node("n1", "192.0.2.11")}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{-time.Second, 1500 * time.Millisecond, 8 * 24 * time.Hour} {
		_, err := e.registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "n1", DrainTimeout: durationpb.New(d)})
		wantField(t, "drain timeout "+d.String(), err, "drain_timeout")
	}
	if got, _ := e.registry.GetNode(ctx, &weirv1.GetNodeRequest{Name: "n1"}); got.GetNode().GetDrained() {
		t.Fatal("a refused drain drained the node")
	}
	before := time.Now()
	first, err := e.registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "n1", DrainTimeout: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := first.GetNode().GetDrainDeadline().AsTime()
	if !first.GetNode().GetDrained() || first.GetWasDrained() || deadline.Before(before.Add(time.Minute)) || deadline.After(time.Now().Add(time.Minute+time.Second)) || deadline.Nanosecond() != 0 {
		t.Errorf("first drain: %v, was drained %v; want drained until a whole second a minute from now", first.GetNode(), first.GetWasDrained())
	}
	again, err := e.registry.DrainNode(ctx, &weirv1.DrainNodeRequest{Name: "n1"})
	if err != nil || !again.GetWasDrained() || !again.GetNode().GetDrainDeadline().AsTime().Equal(deadline) || !again.GetPreviousDrainDeadline().AsTime().Equal(deadline) {
		t.Errorf("second drain without a timeout: %v, %v; want drained already, the deadline kept", again, err)
	}
	un, err := e.registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: "n1"})
	if err != nil || un.GetNode().GetDrained() || un.GetNode().GetDrainDeadline() != nil {
		t.Errorf("uncordon: %v, %v; want the node not drained", un, err)
	}
	_, err = e.registry.UncordonNode(ctx, &weirv1.UncordonNodeRequest{Name: "n9"})
	wantCode(t, "uncordon of an unknown node", err, codes.NotFound, "")
}

// A watch sends what is there, SYNCED, then each change, filtered by
// its label selector; a selector that does not parse is refused.
func TestWatchSendsStateThenChanges(t *testing.T) {
	e := startEdge(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	labelled := func(name, addr, role string) *weirv1.Node {
		n := node(name, addr)
		n.Metadata.Labels = map[string]string{"role": role}
		return n
	}
	if _, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: labelled("n1", "192.0.2.11", "edge")}); err != nil {
		t.Fatal(err)
	}
	w, err := e.registry.WatchNodes(ctx, &weirv1.WatchNodesRequest{LabelSelector: "role=edge"})
	if err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		ev, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return ev.GetType().String() + " " + ev.GetNode().GetMetadata().GetName()
	}
	for _, want := range []string{"WATCH_EVENT_TYPE_ADDED n1", "WATCH_EVENT_TYPE_SYNCED "} {
		if got := next(); got != want {
			t.Fatalf("event %q; want %q", got, want)
		}
	}
	for _, write := range []func() error{
		func() error {
			_, err := e.registry.CreateNode(ctx, &weirv1.CreateNodeRequest{Node: labelled("n2", "192.0.2.12", "core")})
			return err
		},
		func() error {
			_, err := e.registry.UpdateNode(ctx, &weirv1.UpdateNodeRequest{Node: labelled("n1", "192.0.2.21", "edge")})
			return err
		},
		func() error {
			_, err := e.registry.DeleteNode(ctx, &weirv1.DeleteNodeRequest{Name: "n1"})
			return err
		},
	} {
		if err := write(); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"WATCH_EVENT_TYPE_MODIFIED n1", "WATCH_EVENT_TYPE_DELETED n1"} {
		if got := next(); got != want {
			t.Errorf("event %q; want %q (n2 does not match the selector)", got, want)
		}
	}

	bad, err := e.registry.WatchNodes(ctx, &weirv1.WatchNodesRequest{LabelSelector: "role in"})
	if err == nil {
		_, err = bad.Recv()
	}
	if err == io.EOF {
		t.Fatal("a bad selector's watch ended without an error")
	}
	wantCode(t, "a selector that does not parse", err, codes.InvalidArgument, "label_selector:")
}
