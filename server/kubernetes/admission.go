package kubernetes

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirlb/weir/server/kubernetes/api/v1alpha1"
)

// AdmissionPath is where the server answers the apiserver's
// AdmissionReviews (the ValidatingWebhookConfiguration weir.dev).
const AdmissionPath = "/validate"

// MaxReviewBytes bounds an AdmissionReview's body; a larger one is
// refused (413) without being read further, and the apiserver applies the
// webhook's failurePolicy. The largest WeirAddressPool or WeirBGPPeer the server
// takes is about 100 KiB of spec and labels (64 addresses, peers and
// namespaces, two selectors of 64 labels: the CRDs' and the registry's
// bounds); besides that an object carries at most 256 KiB of annotations
// (Kubernetes' bound, kubectl's last-applied-configuration included),
// its status and its managedFields, and an UPDATE's review carries it
// twice (old and new). TestReviewBoundHoldsTheLargestObject builds that
// review.
const MaxReviewBytes = 1 << 20

// Admission answers the apiserver's AdmissionReviews for Weir's custom
// resources with what the server itself would say of them, so that kubectl
// apply refuses, naming the field, what one object cannot tell alone: a
// pool overlapping another, a name the resources file holds, a password
// Secret that does not exist. Two writes racing each other may both pass
// it; the one the server then refuses says so in its Accepted condition.
func (s *Source) Admission() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxReviewBytes))
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			http.Error(w, fmt.Sprintf("an AdmissionReview of more than %d bytes", MaxReviewBytes), http.StatusRequestEntityTooLarge)
			return
		} else if err != nil {
			http.Error(w, "unreadable AdmissionReview", http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		if err := s.admit(review.Request); err != nil {
			resp.Allowed = false
			resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity,
				Reason: metav1.StatusReasonInvalid, Message: err.Error()}
		}
		review.Response, review.Request = resp, nil
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&review)
	})
}

// admit is what the server says of one request: nil to let it through.
func (s *Source) admit(req *admissionv1.AdmissionRequest) error {
	if s.crds == nil || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) ||
		req.Kind.Group != v1alpha1.GroupVersion.Group {
		return nil
	}
	switch req.Kind.Kind {
	case v1alpha1.AddressPoolKind:
		var p v1alpha1.WeirAddressPool
		if err := json.Unmarshal(req.Object.Raw, &p); err != nil {
			return fmt.Errorf("the WeirAddressPool does not read: %w", err)
		}
		m, err := PoolFromCRD(&p)
		if err != nil {
			return err
		}
		return specField(check(s.reg.Pools, m))
	case v1alpha1.BGPPeerKind:
		var p v1alpha1.WeirBGPPeer
		if err := json.Unmarshal(req.Object.Raw, &p); err != nil {
			return fmt.Errorf("the WeirBGPPeer does not read: %w", err)
		}
		m, err := s.crds.peer(&p)
		if err != nil {
			return err
		}
		return specField(check(s.reg.Peers, m))
	}
	return nil
}
