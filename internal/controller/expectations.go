package controller

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// expectationsTimeout bounds how long a job waits for the cache to show its
// own writes; past it the cache is trusted again (a lost watch event must not
// stall a job forever).
const expectationsTimeout = 5 * time.Minute

// Expectations records the pod creates and deletes this controller issued and
// not yet saw in its cache (kueue's and kube's Job controller's pattern).
type Expectations struct {
	mu   sync.Mutex
	jobs map[types.NamespacedName]*expected
	// written is the resourceVersion of the last status this controller wrote
	// for a job: a cached job older than that would make it act on stale
	// bookkeeping (a restart count, the next worker index) and create twice.
	written map[types.NamespacedName]string
}

type expected struct {
	creates map[string]time.Time
	deletes map[string]time.Time
}

// NewExpectations returns an empty store.
func NewExpectations() *Expectations {
	return &Expectations{jobs: map[types.NamespacedName]*expected{}, written: map[types.NamespacedName]string{}}
}

// StatusWritten records the resourceVersion returned by a status write.
func (e *Expectations) StatusWritten(job types.NamespacedName, resourceVersion string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.written[job] = resourceVersion
}

// JobSynced reports whether the cached job is at least as new as the last
// status this controller wrote, compared as the API server orders
// resourceVersions (apimachinery's CompareResourceVersion, comparable since
// Kubernetes 1.35). One that is not well formed is trusted.
func (e *Expectations) JobSynced(job types.NamespacedName, resourceVersion string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	written, ok := e.written[job]
	if !ok {
		return true
	}
	if c, err := resourceversion.CompareResourceVersion(resourceVersion, written); err == nil && c < 0 {
		return false
	}
	delete(e.written, job)
	return true
}

func (e *Expectations) get(job types.NamespacedName) *expected {
	x := e.jobs[job]
	if x == nil {
		x = &expected{creates: map[string]time.Time{}, deletes: map[string]time.Time{}}
		e.jobs[job] = x
	}
	return x
}

// ExpectCreate records that pod name is being created.
func (e *Expectations) ExpectCreate(job types.NamespacedName, name string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.get(job).creates[name] = now
}

// ExpectDelete records that pod name is being deleted.
func (e *Expectations) ExpectDelete(job types.NamespacedName, name string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.get(job).deletes[name] = now
}

// CreateObserved drops a create expectation (the create failed).
func (e *Expectations) CreateObserved(job types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.get(job).creates, name)
}

// DeleteObserved drops a delete expectation (the delete failed).
func (e *Expectations) DeleteObserved(job types.NamespacedName, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.get(job).deletes, name)
}

// Forget drops everything recorded for a job.
func (e *Expectations) Forget(job types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.jobs, job)
	delete(e.written, job)
}

// Satisfied reports whether the cached pods show every create (the pod is
// there) and every delete (the pod is gone or terminating) recorded for the
// job, dropping those that are, and those older than expectationsTimeout.
func (e *Expectations) Satisfied(job types.NamespacedName, pods []*corev1.Pod, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.jobs[job]
	if x == nil {
		return true
	}
	byName := make(map[string]*corev1.Pod, len(pods))
	for _, p := range pods {
		byName[p.Name] = p
	}
	for name, at := range x.creates {
		if byName[name] != nil || now.Sub(at) > expectationsTimeout {
			delete(x.creates, name)
		}
	}
	for name, at := range x.deletes {
		if p := byName[name]; p == nil || p.DeletionTimestamp != nil || now.Sub(at) > expectationsTimeout {
			delete(x.deletes, name)
		}
	}
	if len(x.creates) == 0 && len(x.deletes) == 0 {
		delete(e.jobs, job)
		return true
	}
	return false
}
