package client

import (
	"context"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// Consumer groups are the groups Kafka clients join on an ingestion
// node's Kafka listener (docs/kafka.md): their members share a stream's
// partitions and commit the offsets they consumed, which are stored in an
// internal stream and held from retention. These calls list, describe,
// reset and delete them.

// Groups exposes the raw generated stub of the Groups service.
func (c *Client) Groups() catenapb.GroupsClient { return catenapb.NewGroupsClient(c.conn) }

// ListGroups lists every group the ingestion node's coordinator knows.
func (c *Client) ListGroups(ctx context.Context) ([]*catenapb.GroupSummary, error) {
	resp, err := c.Groups().ListGroups(ctx, &catenapb.ListGroupsRequest{})
	return resp.GetGroups(), err
}

// DescribeGroup reports a group's members and assignments and its
// committed offsets with each partition's end (on stream only, when not
// empty). codes.NotFound: no such group.
func (c *Client) DescribeGroup(ctx context.Context, group, stream string) (*catenapb.GroupDescription, error) {
	return c.Groups().DescribeGroup(ctx, &catenapb.DescribeGroupRequest{Group: group, Stream: stream})
}

// ResetGroupOffsets moves a group's committed offsets on partitions of a
// stream (req.Partitions empty: all of them). The group must have no
// members: codes.FailedPrecondition otherwise, and nothing changes.
func (c *Client) ResetGroupOffsets(ctx context.Context, req *catenapb.ResetGroupOffsetsRequest) ([]*catenapb.GroupOffsetChange, error) {
	resp, err := c.Groups().ResetGroupOffsets(ctx, req)
	return resp.GetChanges(), err
}

// DeleteGroup forgets a group with no members, its committed offsets and
// its retention holds. codes.NotFound: no such group;
// codes.FailedPrecondition: it has members.
func (c *Client) DeleteGroup(ctx context.Context, group string) error {
	_, err := c.Groups().DeleteGroup(ctx, &catenapb.DeleteGroupRequest{Group: group})
	return err
}
