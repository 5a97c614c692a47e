package controller

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// NodeLabel is a node label, KEY=VALUE (--launcher-node-label).
type NodeLabel struct{ Key, Value string }

// ParseNodeLabel reads --launcher-node-label: "" (none) or KEY=VALUE, a
// valid label key and value. A key outside node-restriction.kubernetes.io/
// is taken, and said: a kubelet may set it on its own Node.
func ParseNodeLabel(s string) (l NodeLabel, warning string, err error) {
	if s == "" {
		return NodeLabel{}, "", nil
	}
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return NodeLabel{}, "", fmt.Errorf("%q: want KEY=VALUE (e.g. %s/etjob-trusted=true)", s, NodeRestrictionPrefix)
	}
	if errs := validation.IsQualifiedName(k); len(errs) > 0 {
		return NodeLabel{}, "", fmt.Errorf("%q: the key: %s", s, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		return NodeLabel{}, "", fmt.Errorf("%q: the value: %s", s, strings.Join(errs, "; "))
	}
	if !strings.HasPrefix(k, NodeRestrictionPrefix+"/") {
		warning = fmt.Sprintf("%s is not under %s/: a kubelet may set it on its own Node (NodeRestriction refuses only that prefix), so a rooted node can still attract launchers", k, NodeRestrictionPrefix)
	}
	return NodeLabel{Key: k, Value: v}, warning, nil
}

// NodeRestrictionPrefix is the label prefix the NodeRestriction admission
// plugin keeps kubelets from setting on their own Node.
const NodeRestrictionPrefix = "node-restriction.kubernetes.io"

// The values of --pod-notice-events.
const (
	PodNoticeEventsAgentless = "agentless"
	PodNoticeEventsOff       = "off"
)

// ParsePodNoticeEvents reads --pod-notice-events: "agentless" (pod Events
// are notices for workers on nodes no agent serves) or "off"; it reports
// whether they are off.
func ParsePodNoticeEvents(s string) (off bool, err error) {
	switch s {
	case PodNoticeEventsAgentless:
		return false, nil
	case PodNoticeEventsOff:
		return true, nil
	}
	return false, fmt.Errorf("%q: want %q or %q", s, PodNoticeEventsAgentless, PodNoticeEventsOff)
}
