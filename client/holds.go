package client

import (
	"context"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// Consumer holds: a consumer that must not lose records it has not
// processed yet commits the offset it needs them from, and retention on
// every member of the partition's chain keeps them (up to the stream's
// hard retention limits; a trim past a hold is reported in ListConsumers).
// Consumer names are 1-253 characters of a-z, 0-9, '.', '-', '_' and '/',
// starting and ending with a letter or digit.

// CommitConsumerOffset sets consumer's hold on a partition of stream to
// offset: every record at or above offset is kept. It sets rather than
// raises the hold, so a consumer restored from an older checkpoint may move
// it back. It returns once every member of the partition's chain stored
// the hold durably; on error the hold may be stored on some members, and
// a retry is harmless. codes.InvalidArgument: a bad consumer name;
// codes.NotFound: no such stream or partition.
func (c *Client) CommitConsumerOffset(ctx context.Context, stream string, partition uint32, consumer string, offset uint64) error {
	_, err := c.ingest.CommitConsumerOffset(ctx, &catenapb.CommitConsumerOffsetRequest{Stream: stream, Partition: partition, Consumer: consumer, Offset: offset})
	return err
}

// ListConsumers reports, per partition of stream, the consumers' holds,
// the forced trims of held records, the log start and the committed offset.
func (c *Client) ListConsumers(ctx context.Context, stream string) (*catenapb.ListConsumersResponse, error) {
	return c.ingest.ListConsumers(ctx, &catenapb.ListConsumersRequest{Stream: stream})
}

// DeleteConsumer releases consumer's holds on every partition of stream.
// Deleting a consumer that holds nothing succeeds.
func (c *Client) DeleteConsumer(ctx context.Context, stream, consumer string) error {
	_, err := c.ingest.DeleteConsumer(ctx, &catenapb.DeleteConsumerRequest{Stream: stream, Consumer: consumer})
	return err
}
