//lint:file-ignore SA1019 replies of a server of the previous release name the revision as resource_version only

package main

import (
	"testing"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// A reply names its revision as a number; a server older than that field
// names it only as a resource_version, which is read as one.
func TestRevisionOfAReply(t *testing.T) {
	for _, tc := range []struct {
		r    revisioned
		want uint64
	}{
		{&weirv1.DeleteServiceResponse{ResourceVersion: "42", Revision: 42}, 42},
		{&weirv1.DeleteServiceResponse{ResourceVersion: "41"}, 41},
		{&weirv1.ObjectMeta{ResourceVersion: "7", Revision: 7}, 7},
		{&weirv1.ApplyResponse{}, 0},
		{(*weirv1.DrainNodeResponse)(nil), 0},
	} {
		if got := revisionOf(tc.r); got != tc.want {
			t.Errorf("revisionOf(%v) = %d, want %d", tc.r, got, tc.want)
		}
	}
}

// The server's newest revision is its revision; a server of the previous
// release says it only as state_version, which status shows the same.
func TestServerRevision(t *testing.T) {
	for _, tc := range []struct {
		info *weirv1.GetServerInfoResponse
		want uint64
	}{
		{&weirv1.GetServerInfoResponse{Revision: 12, StateVersion: 12}, 12},
		{&weirv1.GetServerInfoResponse{Revision: 12}, 12},
		{&weirv1.GetServerInfoResponse{StateVersion: 11}, 11},
		{&weirv1.GetServerInfoResponse{}, 0},
	} {
		if got := serverRevision(tc.info); got != tc.want {
			t.Errorf("serverRevision(%v) = %d, want %d", tc.info, got, tc.want)
		}
	}
}
