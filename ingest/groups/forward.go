package groups

import (
	"context"
	"fmt"
	"net"
	"sort"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// Metadata keys of a request one node forwards to another.
const (
	// forwardedKey marks a forwarded request: the node it reaches serves
	// it itself (or refuses it with NotCoordinator), never forwards it on.
	forwardedKey = "catena-groups-forwarded"
	// clientHostKey carries the address of the client that made it, which
	// a group's description shows for each member.
	clientHostKey = "catena-groups-client-host"
)

func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}

// clientHost is the address of the client a request comes from: the
// forwarding node says which, for a forwarded one.
func clientHost(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if h := md.Get(clientHostKey); len(h) > 0 && forwarded(ctx) {
			return h[0]
		}
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return "/" + host
	}
	return "/" + p.Addr.String()
}

// forwardTo is the peer a request about group goes to: ok is false when
// this node serves it (it coordinates the group, there are no peers, or
// the request was forwarded already).
func (s *Service) forwardTo(ctx context.Context, group string) (Peer, bool) {
	if s.Membership == nil || s.Dial == nil || forwarded(ctx) {
		return Peer{}, false
	}
	p, self := s.Membership.Owner(group)
	return p, !self
}

// peerClient is a Groups client of p, and the context to call it with:
// ctx's deadline, the forwarded mark and the client's host.
func (s *Service) peerClient(ctx context.Context, p Peer) (catenapb.GroupsClient, context.Context, error) {
	conn, err := s.Dial(p.Host)
	if err != nil {
		return nil, nil, fmt.Errorf("reach the coordinator %s: %w", p.Host, err)
	}
	out := metadata.AppendToOutgoingContext(ctx, forwardedKey, "1", clientHostKey, clientHost(ctx))
	return catenapb.NewGroupsClient(conn), out, nil
}

// forward makes a request about group on the node that coordinates it,
// when that is another one; done is false when this node serves it.
func forward[Req, Resp any](ctx context.Context, s *Service, group string, req Req, call func(catenapb.GroupsClient, context.Context, Req, ...grpc.CallOption) (Resp, error)) (resp Resp, done bool, err error) {
	p, ok := s.forwardTo(ctx, group)
	if !ok {
		return resp, false, nil
	}
	c, out, err := s.peerClient(ctx, p)
	if err != nil {
		return resp, true, grpcError(refuse(NotCoordinator, "group %q is coordinated by %s: %v", group, p.Host, err))
	}
	resp, err = call(c, out, req)
	return resp, true, err
}

// listEverywhere is ListGroups over every node: this node's groups and
// each peer's. A peer that does not answer fails the list rather than
// leaving its groups out.
func (s *Service) listEverywhere(ctx context.Context, local *catenapb.ListGroupsResponse) (*catenapb.ListGroupsResponse, error) {
	if s.Membership == nil || s.Dial == nil || forwarded(ctx) {
		return local, nil
	}
	all := local.GetGroups()
	for _, p := range s.Membership.Peers() {
		if p == s.Membership.Self() {
			continue
		}
		c, out, err := s.peerClient(ctx, p)
		if err != nil {
			return nil, grpcError(refuse(CoordinatorNotAvailable, "list the groups of %s: %v", p.Host, err))
		}
		resp, err := c.ListGroups(out, &catenapb.ListGroupsRequest{})
		if err != nil {
			return nil, status.Errorf(status.Code(err), "list the groups of %s: %s", p.Host, status.Convert(err).Message())
		}
		all = append(all, resp.GetGroups()...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].GetGroup() < all[j].GetGroup() })
	return &catenapb.ListGroupsResponse{Groups: all}, nil
}
