package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/writetrace"
	"github.com/catena-streams/catena/replica/chain"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
)

const (
	// linkMaxSendBytes bounds the frames carried by one BatchData message.
	linkMaxSendBytes = 1 << 20
	// linkRetryMin and linkRetryMax bound the back-off between attempts to
	// (re)establish the link to a successor.
	linkRetryMin = 20 * time.Millisecond
	linkRetryMax = 1 * time.Second
)

// runLink keeps the replication link to the successor of this epoch up
// until ctx ends (the epoch changed or the partition stopped).
func (p *partition) runLink(ctx context.Context, epoch uint64, succID, succAddr string) {
	defer p.wg.Done()
	backoff := linkRetryMin
	logged := time.Time{} // when a failure was last logged at Info
	for ctx.Err() == nil {
		err := p.linkOnce(ctx, epoch, succID, succAddr)
		p.mu.Lock()
		var downFor time.Duration
		if p.meta != nil && p.meta.Epoch == epoch {
			p.core.SuccessorLost(epoch)
			if p.linkDownSince.IsZero() {
				p.linkDownSince = time.Now()
			}
			p.linkErr, p.stalledSince = err, time.Time{}
			downFor = time.Since(p.linkDownSince)
		}
		p.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		// The first failure of an epoch's link, and then one a
		// minute, at Info: why a link did not come up is what explains
		// the chain's next reconfiguration (the master cuts a link down
		// for its failure timeout).
		if logged.IsZero() || time.Since(logged) >= time.Minute {
			logged = time.Now()
			p.logger.Info("Replication link down, retrying", "successor", succID, "addr", succAddr, "epoch", epoch, "downFor", downFor.Round(time.Millisecond).String(), "error", err.Error())
		} else {
			p.logger.V(1).Info("Replication link down, retrying", "successor", succID, "epoch", epoch, "error", err.Error(), "backoff", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, linkRetryMax)
	}
}

// linkOnce runs one replication stream: hello, then data and commit notices
// down, cumulative acks up.
func (p *partition) linkOnce(ctx context.Context, epoch uint64, succID, succAddr string) error {
	conn, err := p.srv.pool.Get(succAddr)
	if err != nil {
		return err
	}
	// runLink paces the attempts. A connection to a successor that was
	// down (a returning member joins at the tail) may still be waiting out
	// gRPC's reconnect back-off, which had grown while it was away: the
	// link, and with it every write of the chain, waited 0.3-1.3 s for it
	// after the member was back and configured.
	conn.ResetConnectBackoff()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := catenapb.NewReplicaClient(conn).Replicate(ctx)
	if err != nil {
		return fmt.Errorf("failed to open replication stream to %s (%s): %w", succID, succAddr, err)
	}
	hdr := func() *catenapb.ReplicateFrame {
		return &catenapb.ReplicateFrame{Epoch: epoch, Stream: p.stream, Partition: p.index, From: p.srv.id}
	}
	hello := hdr()
	hello.Body = &catenapb.ReplicateFrame_Hello{Hello: &catenapb.LinkHello{}}
	if err := stream.Send(hello); err != nil {
		return fmt.Errorf("failed to send hello to %s: %w", succID, err)
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("successor %s refused the link: %w", succID, err)
	}
	if first.GetEpoch() != epoch {
		return fmt.Errorf("successor %s answered for epoch %d, link is epoch %d", succID, first.GetEpoch(), epoch)
	}
	succEnd := first.GetLogEnd()

	p.mu.Lock()
	if p.meta == nil || p.meta.Epoch != epoch {
		p.mu.Unlock()
		return errors.New("epoch changed while linking")
	}
	eff, err := p.core.SuccessorLinked(epoch, succEnd)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("cannot link to successor %s at its log end %d: %w", succID, succEnd, err)
	}
	p.linkDownSince, p.linkErr = time.Time{}, nil
	p.apply(eff)
	if p.core.Status().SuccessorAck < p.fwdEnd {
		p.stalledSince = time.Now() // re-sent: the successor owes acknowledgements from now
	}
	p.mu.Unlock()
	p.logger.Info("Replication link up", "successor", succID, "epoch", epoch, "successorLogEnd", succEnd)

	// Acks flow up on their own goroutine; any error ends the link.
	ackErr := make(chan error, 1)
	go func() {
		for {
			ack, err := stream.Recv()
			if err != nil {
				ackErr <- err
				cancel()
				return
			}
			p.mu.Lock()
			before := p.core.Status().SuccessorAck
			eff, err := p.core.Acked(ack.GetEpoch(), succID, ack.GetAck())
			if err == nil {
				p.srv.successors.Mark(succAddr)
				p.apply(eff)
				if acked := p.core.Status().SuccessorAck; acked >= p.fwdEnd {
					p.stalledSince = time.Time{}
				} else if acked > before {
					p.stalledSince = time.Now()
				}
			}
			p.mu.Unlock()
			if err != nil {
				ackErr <- fmt.Errorf("bad ack from %s: %w", succID, err)
				cancel()
				return
			}
		}
	}()

	// The upstream-durable offset is read from the core under the lock,
	// while its epoch is still the link's: a value of a later epoch would
	// vouch for another membership.
	sent, sentCommitted, sentDown := succEnd, uint64(0), uint64(0)
	down := func() (uint64, bool) {
		if p.meta == nil || p.meta.Epoch != epoch {
			return 0, false
		}
		return p.core.DurableDown(), true
	}
	for {
		p.mu.Lock()
		for {
			d, ok := down()
			if !ok {
				p.mu.Unlock()
				return errors.New("epoch changed")
			}
			known := sentCommitted
			if first.GetCommitsFromDurable() {
				// A notice would tell it nothing; an older successor
				// learns commits from notices only.
				known = max(known, p.core.SuccessorCommits(sentDown))
			}
			if p.fwdEnd > sent || d > sentDown || p.failed != nil || p.committed > known {
				break
			}
			ch := p.changed
			p.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return linkEnded(ackErr, ctx)
			}
			p.mu.Lock()
		}
		fwdEnd, committed, failed := p.fwdEnd, p.committed, p.failed
		durableDown, _ := down()
		var frames [][]byte
		if fwdEnd > sent {
			frames = p.takeRecent(sent, fwdEnd, linkMaxSendBytes)
		}
		p.mu.Unlock()
		if failed != nil {
			return failed
		}
		f := hdr()
		if fwdEnd > sent {
			if frames == nil {
				var err error
				frames, err = p.log.ReadFrames(sent, fwdEnd, linkMaxSendBytes)
				if err != nil {
					if errors.Is(err, partlog.ErrCorrupt) {
						p.markCorrupt(err)
					}
					return fmt.Errorf("failed to read frames from %d for %s: %w", sent, succID, err)
				}
			}
			var bytes int
			for _, fr := range frames {
				h, err := partlog.DecodeHeader(fr)
				if err != nil {
					return fmt.Errorf("failed to decode own frame at %d: %w", sent, err)
				}
				if h.BaseOffset != sent {
					return fmt.Errorf("own log frame at %d does not start at the forwarding point %d", h.BaseOffset, sent)
				}
				sent = h.End()
				bytes += len(fr)
			}
			f.Body = &catenapb.ReplicateFrame_Data{Data: &catenapb.BatchData{Frames: frames, Committed: committed, UpstreamDurable: durableDown}}
			p.m.bytesOut.Add(float64(bytes))
		} else {
			f.Body = &catenapb.ReplicateFrame_Commit{Commit: &catenapb.CommitNotice{Committed: committed, UpstreamDurable: durableDown}}
		}
		sentCommitted, sentDown = committed, durableDown
		if writetrace.On() {
			if f.GetData() != nil {
				writetrace.Mark(writetrace.Forwarded, p.index, sent)
			}
			writetrace.Mark(writetrace.DownSent, p.index, durableDown)
		}
		if err := stream.Send(f); err != nil {
			return fmt.Errorf("failed to send to %s: %w", succID, err)
		}
	}
}

func linkEnded(ackErr chan error, ctx context.Context) error {
	select {
	case err := <-ackErr:
		return err
	default:
		return ctx.Err()
	}
}

// markCorrupt stops serving a partition whose log failed a checksum.
func (p *partition) markCorrupt(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed == nil {
		p.failed = err
		p.logger.Error(err, "Partition log is corrupt; refusing to serve it")
		p.broadcast()
	}
}

// Replicate is the successor's side of a link.
func (s *Server) Replicate(stream catenapb.Replica_ReplicateServer) error {
	hello, err := stream.Recv()
	if err != nil {
		return err
	}
	if hello.GetHello() == nil {
		return status.Error(codes.InvalidArgument, "a replication stream must start with hello")
	}
	p, err := s.lookup(hello.GetStream(), hello.GetPartition())
	if err != nil {
		return err
	}
	epoch, from := hello.GetEpoch(), hello.GetFrom()
	p.mu.Lock()
	if err := p.usable(); err != nil {
		p.mu.Unlock()
		return err
	}
	if err := p.checkLink(epoch, from); err != nil {
		p.mu.Unlock()
		return err
	}
	logEnd := p.log.NextOffset()
	p.mu.Unlock()
	if err := stream.Send(&catenapb.ReplicateAck{Epoch: epoch, Body: &catenapb.ReplicateAck_LogEnd{LogEnd: logEnd}, CommitsFromDurable: true}); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	sendErr := make(chan error, 1)
	go func() { sendErr <- p.sendAcks(ctx, stream, epoch) }()

	for {
		f, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if writetrace.On() {
			traceReceived(p.index, f)
		}
		if f.GetEpoch() != epoch || f.GetFrom() != from {
			return status.Errorf(codes.InvalidArgument, "frame for epoch %d from %s on a link of epoch %d from %s", f.GetEpoch(), f.GetFrom(), epoch, from)
		}
		if err := p.receive(epoch, from, f); err != nil {
			return err
		}
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}

// traceReceived marks forwarded frames and upstream-durable offsets as
// they come off a link.
func traceReceived(partition uint32, f *catenapb.ReplicateFrame) {
	now := time.Now()
	if d := f.GetData(); d != nil {
		for _, fr := range d.GetFrames() {
			if h, err := partlog.DecodeHeader(fr); err == nil {
				writetrace.MarkAt(writetrace.Received, partition, h.End(), now)
			}
		}
		writetrace.MarkAt(writetrace.DownReceived, partition, d.GetUpstreamDurable(), now)
	} else if c := f.GetCommit(); c != nil {
		writetrace.MarkAt(writetrace.DownReceived, partition, c.GetUpstreamDurable(), now)
	}
}

// checkLink refuses a link from anyone but the predecessor of this epoch.
// Callers hold p.mu.
func (p *partition) checkLink(epoch uint64, from string) error {
	st := p.core.Status()
	switch {
	case p.restored:
		return p.restoredError()
	case epoch < st.Epoch:
		return status.Errorf(codes.FailedPrecondition, "partition %s/%d on %s: link of stale epoch %d refused, replica is at epoch %d", p.stream, p.index, p.srv.id, epoch, st.Epoch)
	case epoch > st.Epoch:
		return status.Errorf(codes.Unavailable, "partition %s/%d on %s: link of epoch %d, replica is still at epoch %d", p.stream, p.index, p.srv.id, epoch, st.Epoch)
	case st.Predecessor != from:
		return status.Errorf(codes.FailedPrecondition, "partition %s/%d on %s: %q is not the predecessor at epoch %d (predecessor is %q)", p.stream, p.index, p.srv.id, from, epoch, st.Predecessor)
	}
	return nil
}

// receive appends forwarded frames and applies commit notices.
func (p *partition) receive(epoch uint64, from string, f *catenapb.ReplicateFrame) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usable(); err != nil {
		return err
	}
	switch body := f.GetBody().(type) {
	case *catenapb.ReplicateFrame_Data:
		wrote := false
		for _, fr := range body.Data.GetFrames() {
			h, recs, err := partlog.DecodeBatchInto(fr, p.recBuf[:0])
			p.recBuf = recs[:0]
			if err != nil {
				return status.Errorf(codes.InvalidArgument, "partition %s/%d: malformed frame from %s: %v", p.stream, p.index, from, err)
			}
			eff, err := p.core.Forwarded(epoch, from, h.BaseOffset, uint64(h.Count), body.Data.GetCommitted(), body.Data.GetUpstreamDurable())
			if err != nil {
				return coreStatus(err, p)
			}
			if eff.Append != nil {
				if eff.Append.Base != h.BaseOffset || eff.Append.End != h.End() {
					// Members hold identical frames, so a partial overlap
					// means the logs have diverged: repair, not append.
					return status.Errorf(codes.OutOfRange, "partition %s/%d: frame [%d,%d) from %s overlaps the local log end %d", p.stream, p.index, h.BaseOffset, h.End(), from, eff.Append.Base)
				}
				if err := p.log.Append(fr); err != nil {
					go p.crashStop(fmt.Errorf("failed to append forwarded frame to partition %s/%d: %w", p.stream, p.index, err))
					return status.Errorf(codes.Unavailable, "replica %s stopped: append failed", p.srv.id)
				}
				p.dedup.addBatch(recs)
				clear(recs) // keep the buffer, not the frame it points into
				p.remember(h.BaseOffset, h.End(), fr)
				p.m.recordsIn.Add(float64(h.Count))
				p.m.bytesIn.Add(float64(len(fr)))
				wrote = true
			}
			p.apply(eff)
		}
		if wrote {
			p.appended()
			if writetrace.On() {
				writetrace.Mark(writetrace.Written, p.index, p.log.NextOffset())
			}
		}
	case *catenapb.ReplicateFrame_Commit:
		eff, err := p.core.CommitNotice(epoch, from, body.Commit.GetCommitted(), body.Commit.GetUpstreamDurable())
		if err != nil {
			return coreStatus(err, p)
		}
		p.apply(eff)
	default:
		return status.Errorf(codes.InvalidArgument, "partition %s/%d: empty replication frame from %s", p.stream, p.index, from)
	}
	return nil
}

// sendAcks sends the cumulative acknowledgement upstream whenever it grows.
func (p *partition) sendAcks(ctx context.Context, stream catenapb.Replica_ReplicateServer, epoch uint64) error {
	var sent uint64
	for {
		p.mu.Lock()
		for p.ackUp <= sent && p.meta.Epoch == epoch && p.failed == nil {
			ch := p.changed
			p.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
			p.mu.Lock()
		}
		ack, cur, failed := p.ackUp, p.meta.Epoch, p.failed
		p.mu.Unlock()
		if failed != nil {
			return failed
		}
		if cur != epoch {
			return status.Errorf(codes.FailedPrecondition, "partition %s/%d moved to epoch %d; link of epoch %d closed", p.stream, p.index, cur, epoch)
		}
		if err := stream.Send(&catenapb.ReplicateAck{Epoch: epoch, Body: &catenapb.ReplicateAck_Ack{Ack: ack}}); err != nil {
			return err
		}
		sent = ack
	}
}

var _ = chain.RoleNone
