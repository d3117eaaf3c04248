package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
)

// largestPool is the largest WeirAddressPool the server takes: every list at
// the CRD's bound, every selector at the registry's 64 labels of the
// longest key and value.
func largestPool(t *testing.T) *v1alpha1.WeirAddressPool {
	t.Helper()
	labels := func(tag string) map[string]string {
		m := map[string]string{}
		for i := range 64 {
			prefix := strings.Repeat(fmt.Sprintf("%s%02d", tag, i)[:3]+strings.Repeat("a", 59)+".", 4)[:252] + "z"
			m[prefix+"/"+strings.Repeat("n", 61)+fmt.Sprintf("%02d", i)] = strings.Repeat("v", 63)
		}
		return m
	}
	var addresses, namespaces []string
	for i := range 64 {
		addresses = append(addresses, fmt.Sprintf("fd%02x:ffff:ffff:ffff:ffff:ffff:ffff:0-fd%02x:ffff:ffff:ffff:ffff:ffff:ffff:ffff", i, i))
		namespaces = append(namespaces, strings.Repeat("n", 61)+fmt.Sprintf("%02d", i))
	}
	var interfaces []string
	for i := range 16 {
		interfaces = append(interfaces, fmt.Sprintf("interface%06d", i))
	}
	p := &v1alpha1.WeirAddressPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.AddressPoolKind},
		ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("p", 253), Labels: labels("l")},
		Spec: v1alpha1.AddressPoolSpec{
			Addresses:         addresses,
			L2Advertisement:   &v1alpha1.L2Advertisement{Interfaces: interfaces, NodeSelector: labels("n")},
			ServiceAllocation: &v1alpha1.ServiceAllocation{Priority: 1, Namespaces: namespaces, ServiceSelector: labels("s")},
		},
	}
	m, err := PoolFromCRD(p)
	if err == nil {
		err = m.Validate()
	}
	if err != nil {
		t.Fatalf("the server does not take the pool: %v", err)
	}
	return p
}

// asKubernetesStores fills in what the apiserver adds to a pool it
// stores: 256 KiB of annotations (Kubernetes' bound; kubectl's
// last-applied-configuration among them), managedFields naming every
// field, and a status whose condition has the longest message.
func asKubernetesStores(t *testing.T, p *v1alpha1.WeirAddressPool) *v1alpha1.WeirAddressPool {
	t.Helper()
	applied, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	const lastApplied, notes, annotationBytes = "kubectl.kubernetes.io/last-applied-configuration", "example.com/notes", 256 << 10
	p.Annotations = map[string]string{lastApplied: string(applied) + "\n"}
	p.Annotations[notes] = strings.Repeat("x", annotationBytes-len(lastApplied)-len(p.Annotations[lastApplied])-len(notes))
	fields := func(prefix string, keys map[string]string) string {
		var b strings.Builder
		for k := range keys {
			fmt.Fprintf(&b, `,%q:{}`, prefix+k)
		}
		return b.String()
	}
	var addrs strings.Builder
	for _, a := range p.Spec.Addresses {
		fmt.Fprintf(&addrs, `,%q:{}`, fmt.Sprintf("v:%q", a))
	}
	fieldsV1 := fmt.Sprintf(`{"f:metadata":{"f:annotations":{".":{}%s},"f:labels":{".":{}%s}},"f:spec":{".":{},"f:addresses":{".":{}%s},"f:l2Advertisement":{"f:interfaces":{},"f:nodeSelector":{".":{}%s}},"f:serviceAllocation":{"f:namespaces":{},"f:priority":{},"f:serviceSelector":{".":{}%s}}}}`,
		fields("f:", p.Annotations), fields("f:", p.Labels), addrs.String(), fields("f:", p.Spec.L2Advertisement.NodeSelector), fields("f:", p.Spec.ServiceAllocation.ServiceSelector))
	if !json.Valid([]byte(fieldsV1)) {
		t.Fatalf("managedFields do not read: %s", fieldsV1)
	}
	now := metav1.Now()
	p.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "weir.dev/v1alpha1", Time: &now, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fieldsV1)},
		{Manager: "weir-server", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "weir.dev/v1alpha1", Time: &now, FieldsType: "FieldsV1", Subresource: "status",
			FieldsV1: metav1.NewFieldsV1(`{"f:status":{".":{},"f:assignedIPv4":{},"f:assignedIPv6":{},"f:availableIPv4":{},"f:availableIPv6":{},"f:conditions":{".":{},"k:{\"type\":\"Accepted\"}":{".":{},"f:lastTransitionTime":{},"f:message":{},"f:observedGeneration":{},"f:reason":{},"f:status":{},"f:type":{}}},"f:mode":{}}}`)},
	}
	p.UID, p.ResourceVersion, p.Generation, p.CreationTimestamp = "0b7c6f2e-5f43-4a3e-9d7e-1c2b3a4d5e6f", "123456789", 12, now
	p.Status = v1alpha1.AddressPoolStatus{Mode: "L2", AvailableIPv6: 1 << 62, Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse,
		ObservedGeneration: 11, LastTransitionTime: now, Reason: strings.Repeat("R", 1024), Message: strings.Repeat("m", 32768)}}}
	return p
}

// updateReview is the review of an UPDATE from old to obj, with the user
// the apiserver names.
func updateReview(t *testing.T, obj, old any) []byte {
	t.Helper()
	raw := func(o any) runtime.RawExtension {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "7d4a6c1e-3f5b-4e2a-8c9d-0a1b2c3d4e5f",
			Kind:     metav1.GroupVersionKind{Group: "weir.dev", Version: "v1alpha1", Kind: v1alpha1.AddressPoolKind},
			Resource: metav1.GroupVersionResource{Group: "weir.dev", Version: "v1alpha1", Resource: v1alpha1.AddressPools.Resource},
			Name:     strings.Repeat("p", 253), Operation: admissionv1.Update,
			UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:gitops:argocd-application-controller", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:gitops", "system:authenticated"}},
			Object:   raw(obj), OldObject: raw(old), Options: raw(metav1.UpdateOptions{FieldManager: "kubectl-client-side-apply"})},
	}
	b, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReviewBoundHoldsTheLargestObject: the review of an update of the
// largest pool the server takes (as stored, annotations and managedFields
// full, twice) is answered; a review past MaxReviewBytes is refused
// (413) without being read whole, whatever its size.
func TestReviewBoundHoldsTheLargestObject(t *testing.T) {
	pool := asKubernetesStores(t, largestPool(t))
	largest := updateReview(t, pool, pool)
	t.Logf("the largest review the server may be sent: %d bytes, %d%% of the bound", len(largest), 100*len(largest)/MaxReviewBytes)
	tooLarge := append(bytes.TrimSuffix(largest, []byte("}")), []byte(`,"padding":"`+strings.Repeat("x", MaxReviewBytes)+`"}`)...)
	h := (&Source{}).Admission()
	for _, tc := range []struct {
		name string
		body []byte
		want int
	}{
		{"the largest pool the server takes", largest, http.StatusOK},
		{"one byte past the bound", append(bytes.Repeat([]byte(" "), MaxReviewBytes+1-len(largest)), largest...), http.StatusRequestEntityTooLarge},
		{"2 MiB", append(tooLarge, bytes.Repeat([]byte(" "), 2<<20-len(tooLarge))...), http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &countingReader{r: bytes.NewReader(tc.body)}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, AdmissionPath, body))
			if rec.Code != tc.want {
				t.Fatalf("%d bytes: answered %d %s; want %d", len(tc.body), rec.Code, rec.Body, tc.want)
			}
			if body.n > MaxReviewBytes+64<<10 {
				t.Errorf("%d bytes read of %d: the bound is %d", body.n, len(tc.body), MaxReviewBytes)
			}
			if tc.want != http.StatusOK {
				return
			}
			var review admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &review); err != nil || review.Response == nil || !review.Response.Allowed {
				t.Errorf("answer %s (%v); want the pool allowed", rec.Body, err)
			}
		})
	}
}

// countingReader counts what is read of it.
type countingReader struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
