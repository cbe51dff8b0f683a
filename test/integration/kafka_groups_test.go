package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/catena-streams/catena/ingest/groups"
)

// ctl runs catenactl against addr and returns its output and exit code.
func ctl(t *testing.T, addr string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(catenactlBin, append([]string{"--server", addr}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("catenactl %v: %v", args, err)
	return "", -1
}

// TestCatenactlGroupAgainstDev: catenactl group lists, describes, resets
// and deletes a Kafka consumer group of catena dev; a reset is refused
// while the group has members, moves the committed offsets and the
// retention holds, and a member that joins next resumes from it; bad
// requests change nothing.
func TestCatenactlGroupAgainstDev(t *testing.T) {
	dir := t.TempDir()
	kafkaAddr := freeAddr(t)
	d := startDev(t, dir, "--stream", "demo:2", "--kafka-listen", kafkaAddr)
	addr := d.state.Ingest
	ctx := ctxT(t, 3*time.Minute)

	prod, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var recs []*kgo.Record
	for i := range 20 {
		recs = append(recs, &kgo.Record{Topic: "demo", Partition: int32(i % 2), Value: fmt.Appendf(nil, "v%d", i)})
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	member, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.ClientID("reader-1"), kgo.ConsumerGroup("readers"), kgo.ConsumeTopics("demo"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	for read := 0; read < 20; {
		fs := member.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		read += len(fs.Records())
		if err := member.CommitRecords(ctx, fs.Records()...); err != nil {
			t.Fatal(err)
		}
	}

	out, code := ctl(t, addr, "group", "list")
	if code != 0 || !regexpLine(out, `readers\s+Stable\s+consumer\s+1`) {
		t.Fatalf("group list: exit %d\n%s", code, out)
	}
	out, code = ctl(t, addr, "group", "describe", "readers")
	if code != 0 || !regexpLine(out, `reader-1\s+/127.0.0.1\s+demo:0,1`) || !regexpLine(out, `demo\s+0\s+10\s+10\s+0\s`) || !regexpLine(out, `demo\s+1\s+10\s+10\s+0\s`) {
		t.Fatalf("group describe: exit %d\n%s", code, out)
	}

	// Refused while the group has a member: nothing changes.
	out, code = ctl(t, addr, "group", "reset", "readers", "--stream", "demo", "--to", "earliest")
	if code != 1 || !strings.Contains(out, "stop its consumers") {
		t.Fatalf("reset with a member: exit %d\n%s", code, out)
	}
	member.Close() // leaves the group
	for _, bad := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--stream", "demo", "--to", "somewhere"}, 2, "invalid position"},
		{[]string{"--stream", "demo"}, 2, "missing --to"},
		{[]string{"--stream", "nope", "--to", "0"}, 1, "nope"},
		{[]string{"--stream", "demo", "--to", "0", "--partitions", "7"}, 1, "partition 7 does not exist"},
		{[]string{"--stream", "demo", "--to", "0", "--partitions", "1,1"}, 2, "named twice"},
	} {
		out, code := ctl(t, addr, append([]string{"group", "reset", "readers"}, bad.args...)...)
		if code != bad.code || !strings.Contains(out, bad.says) {
			t.Errorf("reset %v: exit %d, want %d saying %q\n%s", bad.args, code, bad.code, bad.says, out)
		}
	}
	out, code = ctl(t, addr, "group", "reset", "readers", "--stream", "demo", "--to", "3", "--partitions", "0", "--dry-run")
	if code != 0 || !regexpLine(out, `^0\s+10\s+3\s*$`) || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	out, _ = ctl(t, addr, "group", "describe", "readers")
	if !regexpLine(out, `demo\s+0\s+10\s+10\s+0\s`) {
		t.Fatalf("a dry run changed the offsets:\n%s", out)
	}

	out, code = ctl(t, addr, "group", "reset", "readers", "--stream", "demo", "--to", "3", "--partitions", "0")
	if code != 0 || !regexpLine(out, `^0\s+10\s+3\s*$`) {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	out, code = ctl(t, addr, "group", "reset", "readers", "--stream", "demo", "--to", "99", "--partitions", "1")
	if code != 0 || !regexpLine(out, `^1\s+10\s+10\s+\(moved into the partition's records\)`) {
		t.Fatalf("reset past the end: exit %d\n%s", code, out)
	}
	out, _ = ctl(t, addr, "group", "describe", "readers", "--stream", "demo")
	if !regexpLine(out, `demo\s+0\s+3\s+10\s+7\s`) {
		t.Fatalf("after the reset:\n%s", out)
	}
	out, _ = ctl(t, addr, "consumers", "list", "--stream", "demo")
	if !regexpLine(out, `^0\s+`+groups.HoldName("readers")+`\s+3\s`) {
		t.Fatalf("the group's hold did not move with the reset:\n%s", out)
	}

	// The next member resumes from the reset: 7 records of partition 0.
	again, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.ConsumerGroup("readers"), kgo.ConsumeTopics("demo"), kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 7 && ctx.Err() == nil {
		again.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, fmt.Sprintf("%d/%d", r.Partition, r.Offset)) })
	}
	if strings.Join(got, " ") != "0/3 0/4 0/5 0/6 0/7 0/8 0/9" {
		t.Fatalf("after the reset the group read %v", got)
	}
	again.Close()

	// Deleted: its offsets and holds are gone; a second delete is NotFound.
	if out, code = ctl(t, addr, "group", "delete", "readers"); code != 0 {
		t.Fatalf("delete: exit %d\n%s", code, out)
	}
	if out, _ = ctl(t, addr, "group", "list"); strings.Contains(out, "readers") {
		t.Fatalf("listed after delete:\n%s", out)
	}
	if out, _ = ctl(t, addr, "consumers", "list", "--stream", "demo"); strings.Contains(out, groups.HoldName("readers")) {
		t.Fatalf("the group's holds outlived it:\n%s", out)
	}
	if out, code = ctl(t, addr, "group", "delete", "readers"); code != 1 || !strings.Contains(out, "no group") {
		t.Fatalf("second delete: exit %d\n%s", code, out)
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if offs, err := kadm.NewClient(adm).FetchOffsets(ctx, "readers"); err != nil || len(offs) != 0 {
		t.Fatalf("a deleted group's offsets: %v %v", offs, err)
	}

	// kcat's balanced consumer (librdkafka) in a group: it reads all 20
	// records and commits on exit; run again, it reads only what came
	// after.
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed (apt-get install kcat; .ci/run installs it)")
	}
	kcatGroup := func() []string {
		t.Helper()
		out, err := exec.CommandContext(ctx, kcat, "-b", kafkaAddr, "-G", "kcat-readers", "demo", "-X", "auto.offset.reset=earliest", "-e", "-q", "-f", "%p/%o\n").Output()
		if err != nil {
			t.Fatalf("kcat -G: %v\n%s", err, out)
		}
		return strings.Fields(string(out))
	}
	if got := kcatGroup(); len(got) != 20 {
		t.Fatalf("kcat's group read %d records, want 20: %v", len(got), got)
	}
	if err := prod.ProduceSync(ctx, &kgo.Record{Topic: "demo", Partition: 1, Value: []byte("late")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if got := kcatGroup(); strings.Join(got, " ") != "1/10" {
		t.Fatalf("kcat's group read %v after its commit, want only 1/10", got)
	}

	// catenactl consume --group: a member of a group through the Go
	// client; two runs read the 21 records once between them.
	consumeGroup := func(count int) []string {
		t.Helper()
		out, code := ctl(t, addr, "consume", "--stream", "demo", "--group", "ctl-readers", "--count", fmt.Sprint(count))
		if code != 0 {
			t.Fatalf("consume --group: exit %d\n%s", code, out)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var m struct {
				Partition int
				Offset    int
			}
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("consume printed %q", l)
			}
			got = append(got, fmt.Sprintf("%d/%d", m.Partition, m.Offset))
		}
		return got
	}
	first, second := consumeGroup(15), consumeGroup(6)
	seen := map[string]bool{}
	for _, k := range append(first, second...) {
		if seen[k] {
			t.Fatalf("record %s read twice by the group: %v then %v", k, first, second)
		}
		seen[k] = true
	}
	if len(seen) != 21 {
		t.Fatalf("the group read %d records, want 21", len(seen))
	}
	if out, code := ctl(t, addr, "consume", "--stream", "demo", "--group", "g", "--partition", "0"); code != 2 || !strings.Contains(out, "--group") {
		t.Fatalf("consume --group --partition: exit %d\n%s", code, out)
	}
}

// regexpLine reports whether some line of out matches pattern.
func regexpLine(out, pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, l := range strings.Split(out, "\n") {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

// TestConsumeGroupWithoutKafkaListener: consumer groups are Catena's own
// too, so catena dev without a Kafka listener runs them: the group's
// first generation starts (after the initial rebalance delay, which only
// the coordinator's clock ends) and catenactl consume --group reads.
func TestConsumeGroupWithoutKafkaListener(t *testing.T) {
	d := startDev(t, t.TempDir(), "--stream", "plain:1")
	addr := d.state.Ingest
	for i := range 3 {
		if out, code := ctl(t, addr, "produce", "--stream", "plain", "--value", fmt.Sprintf("v%d", i)); code != 0 {
			t.Fatalf("produce: exit %d\n%s", code, out)
		}
	}
	cmd := exec.Command(catenactlBin, "--server", addr, "consume", "--stream", "plain", "--group", "plain-readers", "--count", "3")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() {
		defer close(done)
		out, err = cmd.CombinedOutput()
	}()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("consume --group read nothing in 90 s: the group never got a generation\n%s", out)
	}
	if err != nil || strings.Count(string(out), `"offset"`) != 3 {
		t.Fatalf("consume --group: %v\n%s", err, out)
	}
}
