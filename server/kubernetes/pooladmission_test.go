package kubernetes

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
	"github.com/weirlb/weir/server/model"
	"github.com/weirlb/weir/server/registry/registrytest"
)

// The webhook refuses a pool over another's addresses whatever their
// ages: one made in the same second with an earlier name, or an older pool
// changed to reach a younger one's, would take the younger's place, which
// the server does only for what the cluster has already.
func TestAdmissionRefusesAPoolTakingAnothersPlace(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	reg := registrytest.Open(t)
	for _, p := range []*model.AddressPool{
		{Meta: model.Meta{Name: "old", Source: model.SourceKubernetes, CreateTime: t0}, Ranges: []model.AddressRange{mustRange(t, "198.51.100.0/28")}},
		{Meta: model.Meta{Name: "young", Source: model.SourceKubernetes, CreateTime: t0.Add(time.Second)}, Ranges: []model.AddressRange{mustRange(t, "203.0.113.0/28")}},
	} {
		if _, err := reg.Pools.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	s := &Source{reg: reg, log: slog.New(slog.DiscardHandler), crds: &crds{refused: map[string]error{}}}
	for _, tc := range []struct {
		name      string
		op        admissionv1.Operation
		pool      string
		created   time.Time
		addresses []string
	}{
		{"made in the same second, an earlier name", admissionv1.Create, "aaa", t0.Add(time.Second), []string{"203.0.113.8/29"}},
		{"an older pool changed onto a younger one's addresses", admissionv1.Update, "old", t0, []string{"198.51.100.0/28", "203.0.113.4/30"}},
	} {
		raw, err := json.Marshal(&v1alpha1.WeirAddressPool{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.AddressPoolKind},
			ObjectMeta: metav1.ObjectMeta{Name: tc.pool, CreationTimestamp: metav1.NewTime(tc.created)},
			Spec:       v1alpha1.AddressPoolSpec{Addresses: tc.addresses},
		})
		if err != nil {
			t.Fatal(err)
		}
		err = s.admit(&admissionv1.AdmissionRequest{Operation: tc.op, Object: runtime.RawExtension{Raw: raw},
			Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: v1alpha1.AddressPoolKind}})
		if err == nil || !strings.Contains(err.Error(), "overlaps pool young") {
			t.Errorf("%s: %v; want a refusal, overlapping young", tc.name, err)
		}
	}
	if _, err := reg.Pools.Get("young"); err != nil {
		t.Errorf("after the reviews: %v", err)
	}
}

func mustRange(t *testing.T, s string) model.AddressRange {
	t.Helper()
	rg, err := model.ParseAddressRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return rg
}
