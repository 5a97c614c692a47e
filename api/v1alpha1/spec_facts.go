package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Facts derived from an ElasticJob's spec that more than one component reads
// (the decision core, render, the CLI): they live with the types.

// ResourceGPU is the extended resource that GPU nodes advertise and the CLI
// asks for with --gpus (nvidia.com/gpu; the local cluster's process nodes
// emulate it).
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// SlotsPerWorker returns the slots per worker in effect: spec.slotsPerWorker,
// else the GPU limit of the worker's first container, else 1. No CRD marker can
// express "default to another field's value", so it is derived here: the decision core publishes it in
// status.slotsPerWorker and render sets it in the workers' environment.
func SlotsPerWorker(spec *ElasticJobSpec) int32 {
	if spec.SlotsPerWorker != nil && *spec.SlotsPerWorker > 0 {
		return *spec.SlotsPerWorker
	}
	if cs := spec.WorkerTemplate.Spec.Containers; len(cs) > 0 {
		for name, q := range cs[0].Resources.Limits {
			if isGPUResource(name) && q.Value() > 0 {
				return int32(q.Value())
			}
		}
	}
	return 1
}

// GPUsPerWorker returns the accelerators the worker's first container asks for.
func GPUsPerWorker(spec *ElasticJobSpec) int64 {
	if cs := spec.WorkerTemplate.Spec.Containers; len(cs) > 0 {
		for name, q := range cs[0].Resources.Limits {
			if isGPUResource(name) {
				return q.Value()
			}
		}
	}
	return 0
}

func isGPUResource(name corev1.ResourceName) bool {
	switch name {
	case ResourceGPU, "amd.com/gpu", "aliyun.com/gpu-mem", "etjob.dev/gpu":
		return true
	}
	return false
}

// GrowthPriorityClass is the PriorityClass of the job's extra workers.
func GrowthPriorityClass(spec *ElasticJobSpec) string {
	if g := spec.Growth; g != nil && g.PriorityClassName != "" {
		return g.PriorityClassName
	}
	return DefaultGrowthPriorityClass
}
