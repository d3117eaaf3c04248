package api

import (
	"context"
	"net/netip"
	"testing"
	"time"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// A Kubernetes service that loses a claim says so in its status, field by
// field; the winner's status is clean.
func TestServiceStatusNamesWhatIsNotProgrammed(t *testing.T) {
	reg := registrytest.Open(t)
	mk := func(ns, name, ip string, age time.Duration, nodePort int32) *model.Service {
		return &model.Service{Meta: model.Meta{Namespace: ns, Name: name, Source: model.SourceKubernetes, CreateTime: time.Now().Add(-age)},
			Type: model.NodePort, ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)},
			Ports:                 []model.ServicePort{{Name: "http", Protocol: model.TCP, Port: 80, NodePort: nodePort}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	}
	for _, s := range []*model.Service{mk("a", "old", "10.96.0.10", time.Hour, 30080), mk("b", "new", "10.96.0.11", time.Minute, 30080)} {
		if _, err := reg.Services.Create(s); err != nil {
			t.Fatal(err)
		}
	}
	api := NewRegistryService(reg)
	got, err := api.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "b", Name: "new"})
	if err != nil {
		t.Fatal(err)
	}
	cs := got.GetService().GetStatus().GetConflicts()
	if len(cs) != 1 || cs[0].GetField() != "spec.ports[0].node_port" || cs[0].GetMessage() != "30080 is a node port of service a/old" {
		t.Errorf("the younger service's conflicts: %v", cs)
	}
	old, _ := api.GetService(context.Background(), &weirv1.GetServiceRequest{Namespace: "a", Name: "old"})
	if cs := old.GetService().GetStatus().GetConflicts(); len(cs) != 0 {
		t.Errorf("the older service shows conflicts: %v", cs)
	}
}
