package registry

import (
	"net/netip"
	"testing"

	"github.com/weirlb/weir/server/model"
)

// TestABatchIsAtItsRevisionWhenItIsTold: whoever learns of a batch's write
// (a watcher, a listener) finds its objects at the batch's revision
// already. A watch event carries the object itself, so a version stamped
// after the event went would be a write under a reader's feet, and an
// event that names a revision its object does not have.
func TestABatchIsAtItsRevisionWhenItIsTold(t *testing.T) {
	_, r := openTestRegistry(t)
	svc := func(name, clusterIP string) *model.Service {
		return &model.Service{Meta: model.Meta{Namespace: "shop", Name: name}, Type: model.ClusterIP,
			ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 80}},
			ExternalTrafficPolicy: model.PolicyCluster, InternalTrafficPolicy: model.PolicyCluster}
	}
	objs := []model.Object{svc("a", "10.96.0.10"), svc("b", "10.96.0.11")}
	told := map[uint64][]uint64{} // a change's revision: its objects' versions then
	r.OnChange(func(ch Change) {
		for _, o := range objs {
			told[ch.Revision] = append(told[ch.Revision], o.GetMeta().ResourceVersion)
		}
	})
	_, events := r.Services.Watch(t.Context(), "", Selector{})
	rev, _, err := r.Apply(objs, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range told[rev] {
		if v != rev {
			t.Errorf("told of revision %d, %s was at version %d", rev, objs[i].GetMeta().Key(), v)
		}
	}
	for range objs {
		e := <-events
		if got := e.Object.GetMeta().ResourceVersion; got != rev {
			t.Errorf("the watch event of %s at revision %d: version %d", e.Object.GetMeta().Key(), rev, got)
		}
	}
}
