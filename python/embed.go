// Package python embeds the files of the worker library that etjob's
// controller hands to pods itself: the launcher's exec transport
// (etjob/kubexec.py) goes into the job's ConfigMap, so the launcher image
// needs neither kubectl nor etjob's library.
package python

import _ "embed"

// Kubexec is etjob/kubexec.py, the horovod launcher's rsh agent.
//
//go:embed etjob/kubexec.py
var Kubexec string
