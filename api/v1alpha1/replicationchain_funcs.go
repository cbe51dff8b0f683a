package v1alpha1

// Head is the name of the chain's head, or "" when it has no members.
func (c *ReplicationChain) Head() string {
	if len(c.Status.Members) == 0 {
		return ""
	}
	return c.Status.Members[0].Name
}

// Tail is the name of the chain's tail, or "" when it has no members.
func (c *ReplicationChain) Tail() string {
	if len(c.Status.Members) == 0 {
		return ""
	}
	return c.Status.Members[len(c.Status.Members)-1].Name
}

// InChain counts the members serving their position in the chain.
func (c *ReplicationChain) InChain() int32 {
	var n int32
	for _, m := range c.Status.Members {
		if m.State == MemberInChain {
			n++
		}
	}
	return n
}

// Converged reports whether every member in the chain has confirmed the
// target epoch: the last reconfiguration is complete. Until it is, the
// operator finishes or redoes it from this status.
func (c *ReplicationChain) Converged() bool {
	for _, m := range c.Status.Members {
		if m.State == MemberInChain && m.ConfirmedEpoch != c.Status.TargetEpoch {
			return false
		}
	}
	return c.InChain() > 0
}
