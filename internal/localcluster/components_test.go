package localcluster

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestLeaseHolder(t *testing.T) {
	now := time.Date(2026, 12, 5, 19, 0, 0, 0, time.UTC)
	lease := func(holder string, renewed time.Duration, seconds int32) *coordinationv1.Lease {
		l := &coordinationv1.Lease{}
		if holder != "" {
			l.Spec.HolderIdentity = &holder
		}
		r := metav1.NewMicroTime(now.Add(-renewed))
		l.Spec.RenewTime = &r
		l.Spec.LeaseDurationSeconds = &seconds
		return l
	}
	for _, c := range []struct {
		name  string
		lease *coordinationv1.Lease
		want  string
	}{
		{"controller-runtime's identity names the pod", lease("etjob-controller-7c6cf6684c-4th7z_1b2c", time.Second, 15), "etjob-controller-7c6cf6684c-4th7z"},
		{"an identity without a uuid", lease("replica-a", time.Second, 15), "replica-a"},
		{"a term that ran out", lease("replica-a_1", 16*time.Second, 15), ""},
		{"no holder", lease("", time.Second, 15), ""},
		{"never renewed", &coordinationv1.Lease{}, ""},
	} {
		if got := LeaseHolder(c.lease, now); got != c.want {
			t.Errorf("%s: LeaseHolder = %q, want %q", c.name, got, c.want)
		}
	}
}
