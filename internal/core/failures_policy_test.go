package core

import (
	"testing"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
)

// TestJudgeFailure: workerRestartPolicy, restartPolicy and backoffLimit as a
// function. Decide's tables (failures_test.go) keep the stories.
func TestJudgeFailure(t *testing.T) {
	limit := int32(2)
	spec := func(worker etjobv1.WorkerRestartPolicy, job etjobv1.RestartPolicy) *etjobv1.ElasticJobSpec {
		return &etjobv1.ElasticJobSpec{WorkerRestartPolicy: worker, RestartPolicy: job, BackoffLimit: &limit}
	}
	for _, c := range []struct {
		name     string
		spec     *etjobv1.ElasticJobSpec
		failures int32
		exit     int32
		want     failureAction
	}{
		{"over the backoff limit, whatever the policies", spec(etjobv1.WorkerRestartAlways, etjobv1.RestartPolicyOnFailure), 3, 1, failOverBackoff},
		{"at the limit: still replaced", spec(etjobv1.WorkerRestartAlways, ""), 2, 1, replaceWorker},
		{"OnFailure replaces", spec(etjobv1.WorkerRestartOnFailure, ""), 1, 1, replaceWorker},
		{"ExitCode, a retryable exit (SIGKILL)", spec(etjobv1.WorkerRestartExitCode, ""), 1, 137, replaceWorker},
		{"ExitCode, a permanent exit, restartPolicy OnFailure: restart", spec(etjobv1.WorkerRestartExitCode, etjobv1.RestartPolicyOnFailure), 1, 1, restartJob},
		{"ExitCode, a permanent exit, restartPolicy Never: fail", spec(etjobv1.WorkerRestartExitCode, etjobv1.RestartPolicyNever), 1, 1, failByPolicy},
		{"Never and OnFailure: restart", spec(etjobv1.WorkerRestartNever, etjobv1.RestartPolicyOnFailure), 1, 1, restartJob},
	} {
		if got := judgeFailure(c.spec, c.failures, c.exit); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
