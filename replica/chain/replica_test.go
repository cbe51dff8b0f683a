package chain

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// builder drives a Replica into a state through the public API, failing the
// test on any unexpected error.
type builder struct {
	t testing.TB
	r *Replica
}

func build(t testing.TB, self string, logEnd uint64) *builder {
	return &builder{t: t, r: New(self, logEnd)}
}

func (b *builder) must(what string, err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatalf("setup %s: %v", what, err)
	}
}

func (b *builder) cfg(epoch uint64, members string) *builder {
	b.t.Helper()
	_, err := b.r.Configure(Config{Epoch: epoch, Members: strings.Split(members, ",")})
	b.must("configure", err)
	return b
}

func (b *builder) propose(n uint64) *builder {
	b.t.Helper()
	_, _, err := b.r.Propose(n)
	b.must("propose", err)
	return b
}

func (b *builder) durable(end uint64) *builder { b.r.Durable(end); return b }

func (b *builder) link(succEnd uint64) *builder {
	b.t.Helper()
	_, err := b.r.SuccessorLinked(b.r.epoch, succEnd)
	b.must("link", err)
	return b
}

func (b *builder) fwd(from string, base, count, committed uint64) *builder {
	b.t.Helper()
	_, err := b.r.Forwarded(b.r.epoch, from, base, count, committed, 0)
	b.must("forwarded", err)
	return b
}

// fwdUp is fwd with the predecessor's upstream-durable offset.
func (b *builder) fwdUp(from string, base, count, committed, up uint64) *builder {
	b.t.Helper()
	_, err := b.r.Forwarded(b.r.epoch, from, base, count, committed, up)
	b.must("forwarded", err)
	return b
}

// upNotice is a notice with the predecessor's upstream-durable offset.
func (b *builder) upNotice(from string, c, up uint64) *builder {
	b.t.Helper()
	_, err := b.r.CommitNotice(b.r.epoch, from, c, up)
	b.must("notice", err)
	return b
}

func (b *builder) ack(from string, end uint64) *builder {
	b.t.Helper()
	_, err := b.r.Acked(b.r.epoch, from, end)
	b.must("acked", err)
	return b
}

func (b *builder) notice(from string, c uint64) *builder {
	b.t.Helper()
	_, err := b.r.CommitNotice(b.r.epoch, from, c, 0)
	b.must("commit notice", err)
	return b
}

func (b *builder) lost() *builder { b.r.SuccessorLost(b.r.epoch); return b }

// Common starting points. Chain [a,b,c] under epoch 2 unless said otherwise.

// headAt: a is head with log 10 durable 10, linked at 0 (forwarded [0,10)).
func headAt(t testing.TB) *builder {
	return build(t, "a", 0).cfg(2, "a,b,c").propose(10).durable(10).link(0)
}

// middleAt: b is middle holding [0,10) durable up to 6, linked at 0.
func middleAt(t testing.TB) *builder {
	return build(t, "b", 0).cfg(2, "a,b,c").fwd("a", 0, 10, 0).durable(6).link(0)
}

// tailAt: c is tail holding [0,10) durable up to 6, told that 4 is
// committed (its own durable end is not).
func tailAt(t testing.TB) *builder {
	return build(t, "c", 0).cfg(2, "a,b,c").fwd("b", 0, 10, 0).durable(6).notice("b", 4)
}

func soleAt(t testing.TB) *builder { return build(t, "a", 4).cfg(2, "a") }

func noneAt(t testing.TB) *builder { return build(t, "z", 4).cfg(2, "a,b,c") }

type opCase struct {
	name    string
	setup   func(testing.TB) *builder
	op      func(r *Replica) (Effects, error)
	wantErr error  // nil: success expected
	wantEff string // fmtEffects of the result, checked on success
	check   func(t *testing.T, st Status)
}

// runOps runs each case; an error must leave the state exactly as it was.
func runOps(t *testing.T, cases []opCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.setup(t).r
			before := r.Status()
			eff, err := tc.op(r)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error = %v, want %v", err, tc.wantErr)
				}
				if !reflect.DeepEqual(eff, Effects{}) {
					t.Errorf("effects on error = %s, want none", fmtEffects(eff))
				}
				if after := r.Status(); !reflect.DeepEqual(before, after) {
					t.Errorf("state changed on error:\nbefore %s\nafter  %s", fmtStatus(before), fmtStatus(after))
				}
			} else {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if got := fmtEffects(eff); got != tc.wantEff {
					t.Errorf("effects = %s, want %s", got, tc.wantEff)
				}
			}
			if tc.check != nil {
				tc.check(t, r.Status())
			}
		})
	}
}

func cfgOp(epoch uint64, members ...string) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) { return r.Configure(Config{Epoch: epoch, Members: members}) }
}

// cfgCommittedOp configures with the committed offset the master knows.
func cfgCommittedOp(epoch, committed uint64, members ...string) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) {
		return r.Configure(Config{Epoch: epoch, Members: members, Committed: committed})
	}
}

func TestNew(t *testing.T) {
	st := New("a", 7).Status()
	want := Status{Self: "a", LogEnd: 7, DurableEnd: 7}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("New: %+v, want %+v", st, want)
	}
	if st.Role != RoleNone || st.Role.String() != "none" {
		t.Fatalf("role %v", st.Role)
	}
}

func TestRoleString(t *testing.T) {
	for r, want := range map[Role]string{RoleNone: "none", RoleHead: "head", RoleMiddle: "middle", RoleTail: "tail", RoleSole: "sole", Role(42): "none"} {
		if r.String() != want {
			t.Errorf("%d: %q, want %q", int(r), r.String(), want)
		}
	}
}

func TestConfigure(t *testing.T) {
	fresh := func(self string, logEnd uint64) func(testing.TB) *builder {
		return func(t testing.TB) *builder { return build(t, self, logEnd) }
	}
	role := func(want Role, pred, succ string) func(*testing.T, Status) {
		return func(t *testing.T, st Status) {
			if st.Role != want || st.Predecessor != pred || st.Successor != succ {
				t.Errorf("role %v pred %q succ %q, want %v %q %q", st.Role, st.Predecessor, st.Successor, want, pred, succ)
			}
		}
	}
	runOps(t, []opCase{
		// Validation.
		{name: "epoch 0", setup: fresh("a", 0), op: cfgOp(0, "a"), wantErr: ErrInvalidConfig},
		{name: "no members", setup: fresh("a", 0), op: cfgOp(1), wantErr: ErrInvalidConfig},
		{name: "empty member name", setup: fresh("a", 0), op: cfgOp(1, "a", ""), wantErr: ErrInvalidConfig},
		{name: "duplicate member", setup: fresh("a", 0), op: cfgOp(1, "a", "b", "a"), wantErr: ErrInvalidConfig},
		{name: "invalid even when configured", setup: headAt, op: cfgOp(3, "b", "b"), wantErr: ErrInvalidConfig},

		// Roles from positions.
		{name: "head", setup: fresh("a", 5), op: cfgOp(1, "a", "b", "c"), wantEff: "no effects", check: role(RoleHead, "", "b")},
		{name: "middle", setup: fresh("b", 5), op: cfgOp(1, "a", "b", "c"), wantEff: "no effects", check: role(RoleMiddle, "a", "c")},
		{name: "tail acks what it holds but does not commit it", setup: fresh("c", 5), op: cfgOp(1, "a", "b", "c"), wantEff: "ack-up=5", check: role(RoleTail, "b", "")},
		{name: "empty tail has nothing to say", setup: fresh("c", 0), op: cfgOp(1, "a", "b", "c"), wantEff: "no effects", check: role(RoleTail, "b", "")},
		{name: "sole commits what it holds", setup: fresh("a", 5), op: cfgOp(1, "a"), wantEff: "committed=5", check: role(RoleSole, "", "")},
		{name: "head of two", setup: fresh("a", 5), op: cfgOp(1, "a", "b"), wantEff: "no effects", check: role(RoleHead, "", "b")},
		{name: "not a member", setup: fresh("z", 5), op: cfgOp(1, "a", "b"), wantEff: "no effects", check: role(RoleNone, "", "")},

		// Epoch comparison.
		{name: "stale epoch", setup: headAt, op: cfgOp(1, "a", "b", "c"), wantErr: ErrStaleEpoch},
		{name: "same epoch other members", setup: headAt, op: cfgOp(2, "a", "c"), wantErr: ErrConflict},
		{name: "same epoch other order", setup: headAt, op: cfgOp(2, "b", "a", "c"), wantErr: ErrConflict},
		{name: "same epoch same members is a no-op", setup: headAt, op: cfgOp(2, "a", "b", "c"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if !st.Linked || st.ForwardedEnd != 10 || len(st.InFlight) != 1 {
					t.Errorf("no-op reset the link: %s", fmtStatus(st))
				}
			}},

		// New epoch resets link state but not the log or committed.
		{name: "new epoch resets link, window and successor ack",
			setup: func(t testing.TB) *builder { return headAt(t).ack("b", 7) },
			op:    cfgOp(3, "a", "b", "c"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if st.Linked || st.InFlight != nil || st.SuccessorAck != 0 || st.ForwardedEnd != 0 {
					t.Errorf("link state survived: %s", fmtStatus(st))
				}
				if st.Committed != 7 || st.LogEnd != 10 || st.DurableEnd != 10 || st.Epoch != 3 {
					t.Errorf("lost log or committed: %s", fmtStatus(st))
				}
			}},
		{name: "head becomes sole and commits what it holds durably, not what is in flight",
			setup: func(t testing.TB) *builder { return headAt(t).ack("b", 4).propose(5) },
			op:    cfgOp(3, "a"), wantEff: "committed=10",
			check: func(t *testing.T, st Status) {
				if st.Role != RoleSole || st.LogEnd != 15 || st.DurableEnd != 10 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		// Under pipelining b's durable log may not be durable on a yet: b
		// acknowledges it to a, which commits it once durable there too.
		{name: "middle becomes tail (tail removed): acks its durable log, does not commit it",
			setup: func(t testing.TB) *builder { return middleAt(t).ack("c", 3).notice("a", 2) },
			op:    cfgOp(3, "a", "b"), wantEff: "ack-up=6",
			check: func(t *testing.T, st Status) {
				if st.Role != RoleTail || st.LogEnd != 10 || st.Successor != "" || st.AckedUpstream != 6 || st.Committed != 2 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "new tail commits from the new head's notice, capped at durable",
			setup: func(t testing.TB) *builder { return middleAt(t).ack("c", 3).cfg(3, "a,b") },
			op:    noticeOp(3, "a", 9), wantEff: "committed=6"},
		{name: "new tail applies a notice heard under the old epoch as durable grows",
			setup: func(t testing.TB) *builder { return middleAt(t).notice("a", 8).cfg(3, "a,b") },
			op:    durableOp(10), wantEff: "ack-up=10 committed=8"},
		{name: "tail stays tail with a new predecessor and re-acknowledges",
			setup: tailAt, op: cfgOp(3, "a", "c"), wantEff: "ack-up=6",
			check: func(t *testing.T, st Status) {
				if st.Predecessor != "a" || st.Committed != 4 || st.AckedUpstream != 6 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "middle becomes sole and commits its durable log",
			setup: func(t testing.TB) *builder { return middleAt(t).notice("a", 2) },
			op:    cfgOp(3, "b"), wantEff: "committed=6",
			check: func(t *testing.T, st Status) {
				if st.Role != RoleSole || st.LogEnd != 10 || st.DurableEnd != 6 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "middle becomes head (head removed) and keeps committed",
			setup: func(t testing.TB) *builder { return middleAt(t).notice("a", 5) },
			op:    cfgOp(3, "b", "c"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if st.Role != RoleHead || st.Committed != 5 || st.SuccessorAck != 0 || st.Linked {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "tail becomes middle (member added) and keeps committed",
			setup: tailAt, op: cfgOp(3, "a", "b", "c", "d"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if st.Role != RoleMiddle || st.Committed != 4 || st.Successor != "d" || st.AckedUpstream != 0 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "removed member keeps its log and committed",
			setup: func(t testing.TB) *builder { return headAt(t).ack("b", 7) },
			op:    cfgOp(3, "b", "c"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if st.Role != RoleNone || st.Committed != 7 || st.LogEnd != 10 || st.Members[0] != "b" {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		// The committed offset the master knows (what a restarted member,
		// or a new head whose predecessor knew more, may not).
		{name: "restarted head learns committed from the configuration",
			setup: fresh("a", 10), op: cfgCommittedOp(3, 7, "a", "b", "c"), wantEff: "committed=7",
			check: func(t *testing.T, st Status) {
				if st.Role != RoleHead || st.Committed != 7 || st.Noticed != 7 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "configuration's committed is capped at the durable end",
			setup: fresh("c", 5), op: cfgCommittedOp(3, 9, "a", "b", "c"), wantEff: "ack-up=5 committed=5",
			check: func(t *testing.T, st Status) {
				if st.Committed != 5 || st.Noticed != 9 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "a lower committed in the configuration moves nothing back",
			setup: func(t testing.TB) *builder { return headAt(t).ack("b", 7) },
			op:    cfgCommittedOp(3, 3, "a", "b", "c"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if st.Committed != 7 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "a replica outside the chain keeps the committed it is told for later",
			setup: fresh("z", 5), op: cfgCommittedOp(3, 4, "a", "b"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if st.Noticed != 4 || st.Committed != 0 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "epochs may skip",
			setup: headAt, op: cfgOp(9, "a", "b"), wantEff: "no effects",
			check: func(t *testing.T, st Status) {
				if st.Epoch != 9 {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
	})
}

func TestConfigureCopiesMembers(t *testing.T) {
	members := []string{"a", "b"}
	r := New("a", 0)
	if _, err := r.Configure(Config{Epoch: 1, Members: members}); err != nil {
		t.Fatal(err)
	}
	members[1] = "x"
	if st := r.Status(); st.Successor != "b" || st.Members[1] != "b" {
		t.Fatalf("configuration aliases the caller's slice: %s", fmtStatus(st))
	}
	// The same epoch with the caller's original members is still a no-op.
	if _, err := r.Configure(Config{Epoch: 1, Members: []string{"a", "b"}}); err != nil {
		t.Fatal(err)
	}
}

func proposeOp(n uint64) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) {
		base, eff, err := r.Propose(n)
		if err == nil && base != r.Status().LogEnd-n {
			return eff, errors.New("base is not the old log end")
		}
		return eff, err
	}
}

func TestPropose(t *testing.T) {
	logEnd := func(want uint64) func(*testing.T, Status) {
		return func(t *testing.T, st Status) {
			if st.LogEnd != want {
				t.Errorf("log end %d, want %d", st.LogEnd, want)
			}
		}
	}
	runOps(t, []opCase{
		{name: "linked head appends at its log end and forwards at once", setup: headAt, op: proposeOp(3), wantEff: "append=[10,13) forward=[10,13)",
			check: func(t *testing.T, st Status) {
				if st.LogEnd != 13 || st.DurableEnd != 10 || st.ForwardedEnd != 13 || !reflect.DeepEqual(st.InFlight, []Range{{0, 10}, {10, 13}}) {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "new head proposes from the log end it inherited",
			setup: func(t testing.TB) *builder { return middleAt(t).cfg(3, "b,c") },
			op:    proposeOp(2), wantEff: "append=[10,12)", check: logEnd(12)},
		{name: "sole", setup: soleAt, op: proposeOp(1), wantEff: "append=[4,5)", check: logEnd(5)},
		{name: "head does not commit what it proposes",
			setup: func(t testing.TB) *builder { return headAt(t).ack("b", 10) },
			op:    proposeOp(2), wantEff: "append=[10,12) forward=[10,12)"},
		{name: "unlinked head still appends",
			setup: func(t testing.TB) *builder { return headAt(t).lost() },
			op:    proposeOp(1), wantEff: "append=[10,11)"},
		{name: "zero records is a no-op", setup: headAt, op: proposeOp(0), wantEff: "no effects", check: logEnd(10)},
		{name: "middle", setup: middleAt, op: proposeOp(1), wantErr: ErrNotHead},
		{name: "tail", setup: tailAt, op: proposeOp(1), wantErr: ErrNotHead},
		{name: "non-member", setup: noneAt, op: proposeOp(1), wantErr: ErrNotMember},
		{name: "non-member is not head either", setup: noneAt, op: proposeOp(1), wantErr: ErrNotHead},
		{name: "unconfigured", setup: func(t testing.TB) *builder { return build(t, "a", 0) }, op: proposeOp(1), wantErr: ErrNotMember},
		{name: "overflow", setup: soleAt, op: proposeOp(math.MaxUint64 - 3), wantErr: ErrOverflow},
	})
}

func durableOp(end uint64) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) { return r.Durable(end), nil }
}

func TestDurable(t *testing.T) {
	st := func(f func(Status) bool) func(*testing.T, Status) {
		return func(t *testing.T, s Status) {
			if !f(s) {
				t.Errorf("%s", fmtStatus(s))
			}
		}
	}
	// An unlinked head with log 10, durable 0.
	pending := func(t testing.TB) *builder { return build(t, "a", 0).cfg(2, "a,b,c").propose(10) }
	runOps(t, []opCase{
		{name: "linked head forwarded at link time, durability forwards nothing but the durable end", setup: func(t testing.TB) *builder { return pending(t).link(0).durable(4) },
			op: durableOp(7), wantEff: "down=7",
			check: st(func(s Status) bool {
				return s.ForwardedEnd == 10 && reflect.DeepEqual(s.InFlight, []Range{{0, 10}}) && s.Committed == 0 && s.DurableEnd == 7
			})},
		{name: "unlinked head forwards nothing", setup: pending, op: durableOp(7), wantEff: "no effects",
			check: st(func(s Status) bool { return s.DurableEnd == 7 })},
		{name: "smaller value ignored", setup: func(t testing.TB) *builder { return pending(t).durable(5) }, op: durableOp(3), wantEff: "no effects",
			check: st(func(s Status) bool { return s.DurableEnd == 5 })},
		{name: "repeated value ignored", setup: func(t testing.TB) *builder { return pending(t).link(0).durable(5) }, op: durableOp(5), wantEff: "no effects"},
		{name: "beyond log end is clamped", setup: func(t testing.TB) *builder { return pending(t).link(0) }, op: durableOp(99), wantEff: "down=10",
			check: st(func(s Status) bool { return s.DurableEnd == 10 })},
		{name: "head commits up to min(durable, successor ack): successor ahead",
			setup: func(t testing.TB) *builder { return pending(t).link(0).durable(4).ack("b", 9) },
			op:    durableOp(6), wantEff: "committed=6 down=6",
			check: st(func(s Status) bool { return s.Committed == 6 && s.SuccessorAck == 9 })},
		{name: "head commits up to min(durable, successor ack): successor behind",
			setup: func(t testing.TB) *builder { return pending(t).link(0).durable(4).ack("b", 5) },
			op:    durableOp(8), wantEff: "committed=5 down=8"},
		{name: "unlinked head sends no durable end down", setup: func(t testing.TB) *builder { return pending(t).link(0).durable(4).lost() },
			op: durableOp(8), wantEff: "no effects", check: st(func(s Status) bool { return s.DurableDown == 8 })},
		{name: "tail commits what is durable here and upstream, without an ack round trip",
			setup: func(t testing.TB) *builder { return tailAt(t).fwdUp("b", 10, 2, 4, 8) },
			op:    durableOp(12), wantEff: "ack-up=12 committed=8",
			check: st(func(s Status) bool { return s.Committed == 8 && s.Upstream == 8 })},
		{name: "tail commits up to its own durable end when upstream is ahead",
			setup: func(t testing.TB) *builder { return tailAt(t).fwdUp("b", 10, 2, 4, 12) },
			op:    durableOp(7), wantEff: "ack-up=7 committed=7"},
		{name: "middle commits what is durable upstream, here and downstream",
			setup: func(t testing.TB) *builder { return middleAt(t).ack("c", 9).upNotice("a", 0, 7) },
			op:    durableOp(8), wantEff: "ack-up=8 committed=7 down=7"},
		{name: "middle passes down the lower of its durable end and upstream's",
			setup: func(t testing.TB) *builder { return middleAt(t).upNotice("a", 0, 9) },
			op:    durableOp(8), wantEff: "down=8",
			check: st(func(s Status) bool { return s.Committed == 0 && s.DurableDown == 8 })},
		{name: "sole commits", setup: func(t testing.TB) *builder { return soleAt(t).propose(3) }, op: durableOp(6), wantEff: "committed=6"},
		{name: "tail acks but does not commit its own durable end", setup: tailAt, op: durableOp(9), wantEff: "ack-up=9",
			check: st(func(s Status) bool { return s.Committed == 4 && s.AckedUpstream == 9 })},
		{name: "tail commits a notice above durable as durable grows",
			setup: func(t testing.TB) *builder { return tailAt(t).notice("b", 8) },
			op:    durableOp(9), wantEff: "ack-up=9 committed=8"},
		{name: "middle acks only what the successor has, commits nothing of its own",
			setup: func(t testing.TB) *builder { return middleAt(t).ack("c", 5) },
			op:    durableOp(8), wantEff: "no effects",
			check: st(func(s Status) bool { return s.AckedUpstream == 5 && s.Committed == 0 })},
		{name: "middle acks up to its durable end when the successor is ahead",
			setup: func(t testing.TB) *builder { return middleAt(t).ack("c", 9) },
			op:    durableOp(8), wantEff: "ack-up=8",
			check: st(func(s Status) bool { return s.Committed == 0 })},
		{name: "unlinked middle forwards nothing and acks no more than its successor holds",
			setup: func(t testing.TB) *builder { return middleAt(t).lost().ack("c", 6).durable(6) },
			op:    durableOp(9), wantEff: "no effects"},
		{name: "middle applies a notice above durable as durable grows",
			setup: func(t testing.TB) *builder { return middleAt(t).notice("a", 9) },
			op:    durableOp(8), wantEff: "committed=8"},
		{name: "non-member records durability silently", setup: func(t testing.TB) *builder { return headAt(t).cfg(3, "b,c") },
			op: durableOp(10), wantEff: "no effects"},
		{name: "non-member with pending appends", setup: func(t testing.TB) *builder { return pending(t).cfg(3, "b,c") },
			op: durableOp(10), wantEff: "no effects",
			check: st(func(s Status) bool { return s.DurableEnd == 10 && s.Committed == 0 })},
	})
}

func fwdOp(epoch uint64, from string, base, count, committed uint64) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) { return r.Forwarded(epoch, from, base, count, committed, 0) }
}

func TestForwarded(t *testing.T) {
	logEnd := func(want uint64) func(*testing.T, Status) {
		return func(t *testing.T, st Status) {
			if st.LogEnd != want {
				t.Errorf("log end %d, want %d", st.LogEnd, want)
			}
		}
	}
	runOps(t, []opCase{
		{name: "linked middle appends at the log end and forwards at once", setup: middleAt, op: fwdOp(2, "a", 10, 5, 0), wantEff: "append=[10,15) forward=[10,15)",
			check: func(t *testing.T, st Status) {
				if st.LogEnd != 15 || st.DurableEnd != 6 || st.ForwardedEnd != 15 || !reflect.DeepEqual(st.InFlight, []Range{{0, 10}, {10, 15}}) {
					t.Errorf("%s", fmtStatus(st))
				}
			}},
		{name: "unlinked middle appends, forwards nothing", setup: func(t testing.TB) *builder { return middleAt(t).lost() },
			op: fwdOp(2, "a", 10, 5, 0), wantEff: "append=[10,15)", check: logEnd(15)},
		{name: "tail appends", setup: tailAt, op: fwdOp(2, "b", 10, 2, 0), wantEff: "append=[10,12)", check: logEnd(12)},
		{name: "tail commits the piggy-backed offset, capped at durable", setup: tailAt, op: fwdOp(2, "b", 10, 2, 9), wantEff: "append=[10,12) committed=6"},
		{name: "duplicate below the log end is ignored", setup: middleAt, op: fwdOp(2, "a", 2, 5, 0), wantEff: "no effects", check: logEnd(10)},
		{name: "duplicate ending exactly at the log end", setup: middleAt, op: fwdOp(2, "a", 0, 10, 0), wantEff: "no effects", check: logEnd(10)},
		{name: "duplicate still carries the committed offset", setup: middleAt, op: fwdOp(2, "a", 0, 3, 4), wantEff: "committed=4"},
		{name: "overlap appends and forwards the new suffix only", setup: middleAt, op: fwdOp(2, "a", 8, 5, 0), wantEff: "append=[10,13) forward=[10,13)", check: logEnd(13)},
		{name: "empty frame is a commit notice", setup: middleAt, op: fwdOp(2, "a", 10, 0, 5), wantEff: "committed=5"},
		{name: "piggy-backed committed capped at durable", setup: middleAt, op: fwdOp(2, "a", 10, 5, 12), wantEff: "append=[10,15) forward=[10,15) committed=6"},
		{name: "committed does not move back", setup: func(t testing.TB) *builder { return middleAt(t).notice("a", 5) },
			op: fwdOp(2, "a", 10, 1, 2), wantEff: "append=[10,11) forward=[10,11)",
			check: func(t *testing.T, st Status) {
				if st.Committed != 5 {
					t.Errorf("committed %d", st.Committed)
				}
			}},
		{name: "gap", setup: middleAt, op: fwdOp(2, "a", 11, 1, 0), wantErr: ErrGap},
		{name: "overflow", setup: middleAt, op: fwdOp(2, "a", 5, math.MaxUint64-2, 0), wantErr: ErrOverflow},
		{name: "stale epoch", setup: middleAt, op: fwdOp(1, "a", 10, 1, 0), wantErr: ErrStaleEpoch},
		{name: "stale epoch with plausible offsets and committed", setup: middleAt, op: fwdOp(1, "a", 10, 5, 10), wantErr: ErrStaleEpoch},
		{name: "future epoch", setup: middleAt, op: fwdOp(3, "a", 10, 1, 0), wantErr: ErrFutureEpoch},
		{name: "from the successor", setup: middleAt, op: fwdOp(2, "c", 10, 1, 0), wantErr: ErrWrongSender},
		{name: "from a stranger", setup: middleAt, op: fwdOp(2, "x", 10, 1, 0), wantErr: ErrWrongSender},
		{name: "at the head", setup: headAt, op: fwdOp(2, "b", 10, 1, 0), wantErr: ErrWrongSender},
		{name: "at a sole member", setup: soleAt, op: fwdOp(2, "a", 4, 1, 0), wantErr: ErrWrongSender},
		{name: "at a non-member", setup: noneAt, op: fwdOp(2, "a", 4, 1, 0), wantErr: ErrNotMember},
		{name: "at an unconfigured replica", setup: func(t testing.TB) *builder { return build(t, "b", 0) }, op: fwdOp(0, "a", 0, 1, 0), wantErr: ErrNotMember},
		{name: "from the old predecessor after reconfiguration", setup: func(t testing.TB) *builder { return tailAt(t).cfg(3, "a,c") },
			op: fwdOp(2, "b", 10, 1, 0), wantErr: ErrStaleEpoch},
		{name: "from the old predecessor under the new epoch", setup: func(t testing.TB) *builder { return tailAt(t).cfg(3, "a,c") },
			op: fwdOp(3, "b", 10, 1, 0), wantErr: ErrWrongSender},
	})
}

func ackOp(epoch uint64, from string, end uint64) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) { return r.Acked(epoch, from, end) }
}

func TestAcked(t *testing.T) {
	st := func(f func(Status) bool) func(*testing.T, Status) {
		return func(t *testing.T, s Status) {
			if !f(s) {
				t.Errorf("%s", fmtStatus(s))
			}
		}
	}
	// Head with log 10, forwarded [0,4) [4,10) as two frames.
	twoFrames := func(t testing.TB) *builder {
		return build(t, "a", 0).cfg(2, "a,b,c").propose(10).link(0).durable(4).durable(10)
	}
	runOps(t, []opCase{
		{name: "head commits", setup: headAt, op: ackOp(2, "b", 7), wantEff: "committed=7",
			check: st(func(s Status) bool { return s.SuccessorAck == 7 && s.Committed == 7 })},
		{name: "ack trims the window partially", setup: twoFrames, op: ackOp(2, "b", 6), wantEff: "committed=6",
			check: st(func(s Status) bool { return reflect.DeepEqual(s.InFlight, []Range{{6, 10}}) })},
		{name: "ack trims whole ranges", setup: twoFrames, op: ackOp(2, "b", 4), wantEff: "committed=4",
			check: st(func(s Status) bool { return reflect.DeepEqual(s.InFlight, []Range{{4, 10}}) })},
		{name: "ack empties the window", setup: twoFrames, op: ackOp(2, "b", 10), wantEff: "committed=10",
			check: st(func(s Status) bool { return s.InFlight == nil })},
		{name: "duplicate ack ignored", setup: func(t testing.TB) *builder { return headAt(t).ack("b", 7) }, op: ackOp(2, "b", 7), wantEff: "no effects"},
		{name: "old ack ignored", setup: func(t testing.TB) *builder { return headAt(t).ack("b", 7) }, op: ackOp(2, "b", 3), wantEff: "no effects",
			check: st(func(s Status) bool { return s.SuccessorAck == 7 && s.Committed == 7 })},
		{name: "ack beyond the durable end, within the log: accepted, commits only what is durable here",
			setup: func(t testing.TB) *builder { return headAt(t).propose(3) }, op: ackOp(2, "b", 12), wantEff: "committed=10",
			check: st(func(s Status) bool { return s.SuccessorAck == 12 && s.Committed == 10 })},
		{name: "ack beyond the log end", setup: func(t testing.TB) *builder { return headAt(t).propose(3) }, op: ackOp(2, "b", 14), wantErr: ErrAckBeyondEnd},
		{name: "head commits up to the ack even with appends in flight",
			setup: func(t testing.TB) *builder { return headAt(t).propose(3) }, op: ackOp(2, "b", 10), wantEff: "committed=10"},
		{name: "head catches up to an ack ahead of it as durable grows",
			setup: func(t testing.TB) *builder { return headAt(t).propose(3).ack("b", 12) }, op: durableOp(13), wantEff: "committed=12 down=13"},
		{name: "ack accepted while unlinked", setup: func(t testing.TB) *builder { return headAt(t).lost() }, op: ackOp(2, "b", 3), wantEff: "committed=3"},
		{name: "middle passes the ack upstream, does not commit", setup: middleAt, op: ackOp(2, "c", 5), wantEff: "ack-up=5",
			check: st(func(s Status) bool { return s.Committed == 0 })},
		{name: "middle ack at its durable end", setup: middleAt, op: ackOp(2, "c", 6), wantEff: "ack-up=6",
			check: st(func(s Status) bool { return s.SuccessorAck == 6 && s.AckedUpstream == 6 && s.Committed == 0 })},
		{name: "middle: ack beyond its durable end acks only what is durable here", setup: middleAt, op: ackOp(2, "c", 9), wantEff: "ack-up=6",
			check: st(func(s Status) bool { return s.SuccessorAck == 9 && s.AckedUpstream == 6 })},
		{name: "middle: ack beyond its log end", setup: middleAt, op: ackOp(2, "c", 11), wantErr: ErrAckBeyondEnd},
		{name: "beyond log end", setup: headAt, op: ackOp(2, "b", 11), wantErr: ErrAckBeyondEnd},
		{name: "stale epoch", setup: headAt, op: ackOp(1, "b", 5), wantErr: ErrStaleEpoch},
		{name: "future epoch", setup: headAt, op: ackOp(3, "b", 5), wantErr: ErrFutureEpoch},
		{name: "from the predecessor", setup: middleAt, op: ackOp(2, "a", 5), wantErr: ErrWrongSender},
		{name: "from a stranger", setup: headAt, op: ackOp(2, "c", 5), wantErr: ErrWrongSender},
		{name: "at the tail", setup: tailAt, op: ackOp(2, "b", 5), wantErr: ErrWrongSender},
		{name: "at a sole member", setup: soleAt, op: ackOp(2, "a", 1), wantErr: ErrWrongSender},
		{name: "at a non-member", setup: noneAt, op: ackOp(2, "b", 1), wantErr: ErrNotMember},
		{name: "from the old successor after middle removal", setup: func(t testing.TB) *builder { return headAt(t).cfg(3, "a,c") },
			op: ackOp(2, "b", 5), wantErr: ErrStaleEpoch},
		{name: "stale ack does not commit at a deposed head", setup: func(t testing.TB) *builder { return headAt(t).cfg(3, "b,c") },
			op: ackOp(2, "b", 10), wantErr: ErrStaleEpoch},
	})
}

func noticeOp(epoch uint64, from string, c uint64) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) { return r.CommitNotice(epoch, from, c, 0) }
}

func TestCommitNotice(t *testing.T) {
	committed := func(want uint64) func(*testing.T, Status) {
		return func(t *testing.T, st Status) {
			if st.Committed != want {
				t.Errorf("committed %d, want %d", st.Committed, want)
			}
		}
	}
	runOps(t, []opCase{
		{name: "middle learns", setup: middleAt, op: noticeOp(2, "a", 4), wantEff: "committed=4", check: committed(4)},
		{name: "capped at durable", setup: middleAt, op: noticeOp(2, "a", 9), wantEff: "committed=6", check: committed(6)},
		{name: "never backwards", setup: func(t testing.TB) *builder { return middleAt(t).notice("a", 5) }, op: noticeOp(2, "a", 2), wantEff: "no effects", check: committed(5)},
		{name: "duplicate", setup: func(t testing.TB) *builder { return middleAt(t).notice("a", 5) }, op: noticeOp(2, "a", 5), wantEff: "no effects"},
		{name: "tail learns", setup: tailAt, op: noticeOp(2, "b", 6), wantEff: "committed=6", check: committed(6)},
		{name: "tail learns only up to its durable end", setup: tailAt, op: noticeOp(2, "b", 10), wantEff: "committed=6", check: func(t *testing.T, st Status) {
			committed(6)(t, st)
			if st.Noticed != 10 || st.DurableEnd >= st.Noticed {
				t.Errorf("noticed %d with durable end %d: a member behind the chain's commits must say so", st.Noticed, st.DurableEnd)
			}
		}},
		{name: "tail already knows", setup: tailAt, op: noticeOp(2, "b", 4), wantEff: "no effects", check: committed(4)},
		{name: "stale epoch", setup: middleAt, op: noticeOp(1, "a", 4), wantErr: ErrStaleEpoch},
		{name: "future epoch", setup: middleAt, op: noticeOp(3, "a", 4), wantErr: ErrFutureEpoch},
		{name: "from the successor", setup: middleAt, op: noticeOp(2, "c", 4), wantErr: ErrWrongSender},
		{name: "at the head", setup: headAt, op: noticeOp(2, "b", 4), wantErr: ErrWrongSender},
		{name: "at a non-member", setup: noneAt, op: noticeOp(2, "a", 4), wantErr: ErrNotMember},
	})
}

func linkOp(epoch, succEnd uint64) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) { return r.SuccessorLinked(epoch, succEnd) }
}

func TestSuccessorLinked(t *testing.T) {
	st := func(f func(Status) bool) func(*testing.T, Status) {
		return func(t *testing.T, s Status) {
			if !f(s) {
				t.Errorf("%s", fmtStatus(s))
			}
		}
	}
	unlinked := func(t testing.TB) *builder { return build(t, "a", 0).cfg(2, "a,b,c").propose(10).durable(8) }
	runOps(t, []opCase{
		{name: "forwards everything written from the successor's log end", setup: unlinked, op: linkOp(2, 3), wantEff: "forward=[3,10) down=8",
			check: st(func(s Status) bool {
				return s.Linked && s.ForwardedEnd == 10 && reflect.DeepEqual(s.InFlight, []Range{{3, 10}})
			})},
		{name: "log end is not an acknowledgement", setup: unlinked, op: linkOp(2, 10), wantEff: "down=8",
			check: st(func(s Status) bool { return s.SuccessorAck == 0 && s.Committed == 0 && s.ForwardedEnd == 10 })},
		{name: "successor at the durable end gets the rest of the log", setup: unlinked, op: linkOp(2, 8), wantEff: "forward=[8,10) down=8",
			check: st(func(s Status) bool { return s.Linked && s.ForwardedEnd == 10 })},
		{name: "successor holds records not durable here", setup: unlinked, op: linkOp(2, 9), wantEff: "forward=[9,10) down=8",
			check: st(func(s Status) bool { return s.Linked && s.ForwardedEnd == 10 && s.SuccessorAck == 0 })},
		{name: "successor at the log end: a new link hears the durable end again", setup: unlinked, op: linkOp(2, 10), wantEff: "down=8",
			check: st(func(s Status) bool { return s.Linked && s.InFlight == nil })},
		{name: "successor holds records not in the log here", setup: unlinked, op: linkOp(2, 11), wantErr: ErrBehind},
		{name: "middle relinks after middle removal", setup: func(t testing.TB) *builder { return middleAt(t).lost() }, op: linkOp(2, 2), wantEff: "forward=[2,10)"},
		{name: "relink replaces the window",
			setup: func(t testing.TB) *builder { return headAt(t).ack("b", 2) },
			op:    linkOp(2, 5), wantEff: "forward=[5,10) down=10",
			check: st(func(s Status) bool { return reflect.DeepEqual(s.InFlight, []Range{{5, 10}}) && s.SuccessorAck == 2 })},
		{name: "successor regressed below its ack", setup: func(t testing.TB) *builder { return headAt(t).ack("b", 6).lost() }, op: linkOp(2, 5), wantErr: ErrSuccessorRegressed},
		{name: "stale epoch", setup: unlinked, op: linkOp(1, 0), wantErr: ErrStaleEpoch},
		{name: "future epoch", setup: unlinked, op: linkOp(3, 0), wantErr: ErrFutureEpoch},
		{name: "tail has no successor", setup: tailAt, op: linkOp(2, 0), wantErr: ErrNoSuccessor},
		{name: "sole has no successor", setup: soleAt, op: linkOp(2, 0), wantErr: ErrNoSuccessor},
		{name: "non-member", setup: noneAt, op: linkOp(2, 0), wantErr: ErrNotMember},
	})
}

func TestSuccessorLost(t *testing.T) {
	b := headAt(t)
	b.r.SuccessorLost(1) // another epoch: ignored
	if st := b.r.Status(); !st.Linked {
		t.Fatalf("loss under another epoch unlinked: %s", fmtStatus(st))
	}
	b.r.SuccessorLost(2)
	st := b.r.Status()
	if st.Linked || st.InFlight != nil {
		t.Fatalf("still linked: %s", fmtStatus(st))
	}
	if _, eff, err := b.r.Propose(5); err != nil || fmtEffects(eff) != "append=[10,15)" {
		t.Fatalf("propose while unlinked: %s, %v", fmtEffects(eff), err)
	}
	if eff := b.r.Durable(15); fmtEffects(eff) != "no effects" {
		t.Fatalf("forwarded while unlinked: %s", fmtEffects(eff))
	}
	b.r.SuccessorLost(2) // twice: harmless
	eff, err := b.r.SuccessorLinked(2, 10)
	if err != nil || fmtEffects(eff) != "forward=[10,15) down=15" {
		t.Fatalf("relink: %s, %v", fmtEffects(eff), err)
	}
}

func TestStatusIsASnapshot(t *testing.T) {
	r := headAt(t).r
	st := r.Status()
	st.Members[0] = "x"
	st.InFlight[0].Base = 99
	again := r.Status()
	if again.Members[0] != "a" || again.InFlight[0].Base != 0 {
		t.Fatalf("Status aliases internal state: %s", fmtStatus(again))
	}
}

// TestCommittedSurvivesSuccessorAckReset walks one head through epochs in
// which its successor's ack restarts from zero.
func TestCommittedSurvivesSuccessorAckReset(t *testing.T) {
	b := headAt(t).ack("b", 8)
	b.cfg(3, "a,c")
	if eff, err := b.r.Acked(3, "c", 5); err != nil || fmtEffects(eff) != "no effects" {
		t.Fatalf("lower ack under a new epoch: %s, %v", fmtEffects(eff), err)
	}
	if st := b.r.Status(); st.Committed != 8 || st.SuccessorAck != 5 {
		t.Fatalf("%s", fmtStatus(st))
	}
	if eff, _ := b.r.Acked(3, "c", 9); fmtEffects(eff) != "committed=9" {
		t.Fatalf("ack 9: %s", fmtEffects(eff))
	}
}

// TestDeposedHeadCannotCommit: a head removed under a newer epoch that it
// has not heard of keeps proposing, but every member that has moved on
// refuses its frames, and its own successor's acks under the new epoch are
// refused by it, so its committed offset cannot move.
func TestDeposedHeadCannotCommit(t *testing.T) {
	oldHead := headAt(t).r // epoch 2, [a,b,c]
	mid := middleAt(t)
	mid.cfg(3, "b,c")
	if _, _, err := oldHead.Propose(5); err != nil {
		t.Fatal(err)
	}
	oldHead.Durable(15)
	if _, err := mid.r.Forwarded(2, "a", 10, 5, 0, 0); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("new head accepted the deposed head's frame: %v", err)
	}
	if _, err := oldHead.Acked(3, "b", 10); !errors.Is(err, ErrFutureEpoch) {
		t.Fatalf("deposed head accepted an ack from the new epoch: %v", err)
	}
	if st := oldHead.Status(); st.Committed != 0 {
		t.Fatalf("deposed head committed: %s", fmtStatus(st))
	}
}

func copyOp(base, count, committed uint64) func(*Replica) (Effects, error) {
	return func(r *Replica) (Effects, error) { return r.Copied(base, count, committed) }
}

func TestCopied(t *testing.T) {
	st := func(logEnd, durable, committed uint64) func(*testing.T, Status) {
		return func(t *testing.T, s Status) {
			if s.LogEnd != logEnd || s.DurableEnd != durable || s.Committed != committed {
				t.Errorf("%s, want log end %d durable %d committed %d", fmtStatus(s), logEnd, durable, committed)
			}
		}
	}
	// A non-member z holding [0,4) copies; when it joins at the tail the
	// committed offset it copied under applies up to what it made durable.
	joined := func(t testing.TB) *builder {
		b := noneAt(t)
		_, err := b.r.Copied(4, 6, 10)
		b.must("copied", err)
		return b.durable(10)
	}
	runOps(t, []opCase{
		{name: "a non-member appends copied records at its log end", setup: noneAt, op: copyOp(4, 6, 10), wantEff: "append=[4,10)", check: st(10, 4, 0)},
		{name: "an unconfigured replica (new, empty) copies from offset 0", setup: func(t testing.TB) *builder { return build(t, "z", 0) },
			op: copyOp(0, 5, 5), wantEff: "append=[0,5)", check: st(5, 0, 0)},
		{name: "a duplicate appends nothing", setup: noneAt, op: copyOp(0, 4, 4), wantEff: "no effects", check: st(4, 4, 0)},
		{name: "an overlap appends the new suffix", setup: noneAt, op: copyOp(2, 5, 7), wantEff: "append=[4,7)", check: st(7, 4, 0)},
		{name: "a non-member commits nothing", setup: func(t testing.TB) *builder { return noneAt(t).durable(4) }, op: copyOp(4, 2, 6), wantEff: "append=[4,6)", check: st(6, 4, 0)},
		{name: "joining at the tail applies the copied commits up to durable", setup: joined, op: cfgOp(3, "a", "b", "z"),
			wantEff: "ack-up=10 committed=10", check: st(10, 10, 10)},
		{name: "gap", setup: noneAt, op: copyOp(5, 1, 6), wantErr: ErrGap},
		{name: "overflow", setup: noneAt, op: copyOp(1, math.MaxUint64-0, 0), wantErr: ErrOverflow},
		{name: "a head", setup: headAt, op: copyOp(10, 1, 11), wantErr: ErrMember},
		{name: "a middle", setup: middleAt, op: copyOp(10, 1, 11), wantErr: ErrMember},
		{name: "a tail", setup: tailAt, op: copyOp(10, 1, 11), wantErr: ErrMember},
		{name: "a sole member", setup: soleAt, op: copyOp(4, 1, 5), wantErr: ErrMember},
	})
}

// TestSuccessorCommitsWhatItWasTold: the committed offset a member may
// leave out of its notices is one its successor has committed by itself,
// from the upstream-durable offset it heard and its own acknowledgement.
func TestSuccessorCommitsWhatItWasTold(t *testing.T) {
	// b, the middle of [a,b,c], holds [0,10) durable, heard a's
	// upstream-durable 10, and c acknowledged 8: b acks 8 to a.
	b := build(t, "b", 0).cfg(2, "a,b,c").fwdUp("a", 0, 10, 0, 10).durable(10).link(0).ack("c", 8)
	a := headAt(t).ack("b", b.r.Status().AckedUpstream)
	for _, sent := range []uint64{0, 6, 10} {
		if got, knows := a.r.SuccessorCommits(sent), b.r.Status().Committed; got > knows {
			t.Errorf("sent %d: a may leave out notices up to %d, b committed only %d", sent, got, knows)
		}
	}
	if got := a.r.SuccessorCommits(10); got != 8 {
		t.Errorf("SuccessorCommits(10) = %d, want 8 (b's ack)", got)
	}
	if got := a.r.SuccessorCommits(6); got != 6 {
		t.Errorf("SuccessorCommits(6) = %d, want 6 (what b heard)", got)
	}
	if got := tailAt(t).r.SuccessorCommits(10); got != 0 {
		t.Errorf("a tail has no successor to leave notices out for: %d", got)
	}
}
