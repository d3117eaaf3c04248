package main

import (
	"context"

	weirv1 "github.com/weirlb/weir/proto/weir/v1"
)

// The server pages every List; these read every page.

// allPages calls list with each next page token until the last page.
func allPages[T any](list func(token string) ([]T, string, error)) ([]T, error) {
	var all []T
	token := ""
	for {
		items, next, err := list(token)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		token = next
	}
}

func listServices(ctx context.Context, c client, req *weirv1.ListServicesRequest) ([]*weirv1.Service, error) {
	return allPages(func(token string) ([]*weirv1.Service, string, error) {
		req.PageToken = token
		r, err := c.ListServices(ctx, req)
		return r.GetServices(), r.GetNextPageToken(), err
	})
}

func listEndpointSlices(ctx context.Context, c client, req *weirv1.ListEndpointSlicesRequest) ([]*weirv1.EndpointSlice, error) {
	return allPages(func(token string) ([]*weirv1.EndpointSlice, string, error) {
		req.PageToken = token
		r, err := c.ListEndpointSlices(ctx, req)
		return r.GetEndpointSlices(), r.GetNextPageToken(), err
	})
}

func listNodes(ctx context.Context, c client, req *weirv1.ListNodesRequest) ([]*weirv1.Node, error) {
	return allPages(func(token string) ([]*weirv1.Node, string, error) {
		req.PageToken = token
		r, err := c.ListNodes(ctx, req)
		return r.GetNodes(), r.GetNextPageToken(), err
	})
}

func listAddressPools(ctx context.Context, c client) ([]*weirv1.AddressPool, error) {
	return allPages(func(token string) ([]*weirv1.AddressPool, string, error) {
		r, err := c.ListAddressPools(ctx, &weirv1.ListAddressPoolsRequest{PageToken: token})
		return r.GetAddressPools(), r.GetNextPageToken(), err
	})
}

func listBgpPeers(ctx context.Context, c client) ([]*weirv1.BgpPeer, error) {
	return allPages(func(token string) ([]*weirv1.BgpPeer, string, error) {
		r, err := c.ListBgpPeers(ctx, &weirv1.ListBgpPeersRequest{PageToken: token})
		return r.GetBgpPeers(), r.GetNextPageToken(), err
	})
}

func listNodeStatuses(ctx context.Context, st weirv1.StatusServiceClient) ([]*weirv1.NodeStatus, error) {
	return allPages(func(token string) ([]*weirv1.NodeStatus, string, error) {
		r, err := st.ListNodeStatuses(ctx, &weirv1.ListNodeStatusesRequest{PageToken: token})
		return r.GetNodes(), r.GetNextPageToken(), err
	})
}
