package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/catena-streams/catena/rpc/catenapb"
)

type describeFlags struct {
	stream string
	output string
}

// JSON shapes of describe -o json.
type (
	streamJSON struct {
		Stream     string          `json:"stream"`
		Config     configJSON      `json:"config"`
		Partitions []partitionJSON `json:"partitions"`
	}
	configJSON struct {
		Partitions         uint32 `json:"partitions"`
		Durability         string `json:"durability"`
		FsyncIntervalMs    uint32 `json:"fsync_interval_ms,omitempty"`
		RetentionBytes     int64  `json:"retention_bytes,omitempty"`
		RetentionMs        int64  `json:"retention_ms,omitempty"`
		HardRetentionBytes int64  `json:"hard_retention_bytes,omitempty"`
		HardRetentionMs    int64  `json:"hard_retention_ms,omitempty"`
		SegmentBytes       int64  `json:"segment_bytes,omitempty"`
		MaxRecordBytes     uint32 `json:"max_record_bytes,omitempty"`
	}
	partitionJSON struct {
		Partition uint32       `json:"partition"`
		Epoch     uint64       `json:"epoch"`
		Chain     []memberJSON `json:"chain"`
	}
	memberJSON struct {
		ID           string `json:"id"`
		Addr         string `json:"addr"`
		Reported     bool   `json:"reported"`
		Role         string `json:"role,omitempty"`
		Epoch        uint64 `json:"epoch,omitempty"`
		LogStart     uint64 `json:"log_start"`
		LogEnd       uint64 `json:"log_end"`
		Durable      uint64 `json:"durable"`
		Committed    uint64 `json:"committed"`
		SuccessorAck uint64 `json:"successor_ack"`
		Checksum     string `json:"checksum,omitempty"`
		Error        string `json:"error,omitempty"`
	}
)

func newDescribeCommand(a *app) *cobra.Command {
	var f describeFlags
	cmd := &cobra.Command{
		Use:   "describe [--stream S] [-o table|json]",
		Short: "Show the chains of a stream's partitions, or list streams",
		Long: "With --stream: each partition's epoch and chain (head..tail) with every\n" +
			"member's role, log start/end, durable and committed offsets, checksum and\n" +
			"error as the member reports them. Without --stream: list the streams.",
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.describe(cmd, &f)
		}),
	}
	cmd.Flags().StringVar(&f.stream, "stream", "", "stream to describe (default: list streams)")
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	return cmd
}

func (a *app) describe(cmd *cobra.Command, f *describeFlags) error {
	if f.output != "table" && f.output != "json" {
		return usageErrorf("bad --output %q: want table or json", f.output)
	}
	ctx := cmd.Context()
	c, err := a.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if f.stream == "" {
		names, err := c.ListStreams(ctx)
		if err != nil {
			return err
		}
		if f.output == "json" {
			if names == nil {
				names = []string{}
			}
			return writeIndentedJSON(a, map[string][]string{"streams": names})
		}
		for _, n := range names {
			if _, err := fmt.Fprintln(a.stdout, n); err != nil {
				return err
			}
		}
		return nil
	}
	d, err := c.Describe(ctx, f.stream)
	if err != nil {
		return err
	}
	s := toStreamJSON(d)
	if f.output == "json" {
		return writeIndentedJSON(a, s)
	}
	return writeDescribeTable(a, s)
}

func writeIndentedJSON(a *app, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

func roleName(r catenapb.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

func toStreamJSON(d *catenapb.StreamDescription) streamJSON {
	s := streamJSON{Stream: d.Stream, Partitions: []partitionJSON{}}
	if cfg := d.Config; cfg != nil {
		s.Config = configJSON{
			Partitions: cfg.Partitions, Durability: strings.ToLower(strings.TrimPrefix(cfg.Durability.String(), "DURABILITY_")),
			FsyncIntervalMs: cfg.FsyncIntervalMs, RetentionBytes: cfg.RetentionBytes, RetentionMs: cfg.RetentionMs,
			SegmentBytes: cfg.SegmentBytes, MaxRecordBytes: cfg.MaxRecordBytes,
			HardRetentionBytes: cfg.HardRetentionBytes, HardRetentionMs: cfg.HardRetentionMs,
		}
	}
	for _, p := range d.Partitions {
		pj := partitionJSON{Partition: p.Partition, Epoch: p.Epoch, Chain: []memberJSON{}}
		reports := map[string]*catenapb.PartitionStatus{}
		for _, r := range p.Replicas {
			reports[r.ReplicaId] = r
		}
		seen := map[string]bool{}
		add := func(id, addr string) {
			m := memberJSON{ID: id, Addr: addr}
			if r := reports[id]; r != nil {
				m.Reported = true
				m.Role = roleName(r.Role)
				m.Epoch = r.Epoch
				m.LogStart, m.LogEnd, m.Durable, m.Committed, m.SuccessorAck = r.LogStart, r.LogEnd, r.Durable, r.Committed, r.SuccessorAck
				m.Checksum = fmt.Sprintf("%08x", r.Checksum)
				m.Error = r.Error
			}
			seen[id] = true
			pj.Chain = append(pj.Chain, m)
		}
		for _, m := range p.Members {
			add(m.Id, m.Addr)
		}
		// Reports from replicas that are not (or no longer) chain members.
		for _, r := range p.Replicas {
			if !seen[r.ReplicaId] {
				add(r.ReplicaId, "")
			}
		}
		s.Partitions = append(s.Partitions, pj)
	}
	return s
}

func writeDescribeTable(a *app, s streamJSON) error {
	fmt.Fprintf(a.stdout, "STREAM %s  partitions=%d  durability=%s\n", s.Stream, s.Config.Partitions, s.Config.Durability)
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tEPOCH\tCHAIN\tMEMBER\tADDR\tROLE\tLOG_START\tLOG_END\tDURABLE\tCOMMITTED\tCHECKSUM\tERROR")
	for _, p := range s.Partitions {
		chain := "-"
		if n := len(p.Chain); n > 0 {
			chain = p.Chain[0].ID + ".." + p.Chain[n-1].ID
		}
		if len(p.Chain) == 0 {
			fmt.Fprintf(tw, "%d\t%d\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\n", p.Partition, p.Epoch, chain)
		}
		for i, m := range p.Chain {
			part, epoch := "", ""
			if i == 0 {
				part, epoch = fmt.Sprint(p.Partition), fmt.Sprint(p.Epoch)
			} else {
				chain = ""
			}
			addr := m.Addr
			if addr == "" {
				addr = "-"
			}
			if !m.Reported {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\tunreported\t-\t-\t-\t-\t-\t-\n", part, epoch, chain, m.ID, addr)
				continue
			}
			errStr := m.Error
			if errStr == "" {
				errStr = "-"
			}
			role := m.Role
			if m.Epoch != p.Epoch {
				role += fmt.Sprintf(" (epoch %d)", m.Epoch)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n",
				part, epoch, chain, m.ID, addr, role, m.LogStart, m.LogEnd, m.Durable, m.Committed, m.Checksum, errStr)
		}
	}
	return tw.Flush()
}
