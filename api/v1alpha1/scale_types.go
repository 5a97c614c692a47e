package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ScaleRequestSpec is the common spec of ScaleOut and ScaleIn, et-operator's
// request objects: `etjob scaleout/scalein` create them, a reconciler changes
// the job's spec.replicas through /scale and records the outcome, so the
// request survives the CLI's exit.
type ScaleRequestSpec struct {
	// job names the ElasticJob to scale, in the request's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.job is immutable"
	Job string `json:"job"`

	// count is the number of workers to add (ScaleOut) or remove (ScaleIn).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Count int32 `json:"count,omitempty"`

	// instances names the worker pods to remove (ScaleIn only); count is then
	// their number.
	// +kubebuilder:validation:MaxItems=1000
	// +listType=set
	// +optional
	Instances []string `json:"instances,omitempty"`

	// timeoutSeconds bounds how long the change may take (Arena's --timeout,
	// default 60 s). A ScaleOut whose new workers are not members in time is
	// rolled back.
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=1
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// ScaleRequestPhase is where a scale request stands.
type ScaleRequestPhase string

const (
	// ScaleRequestScaling: spec.replicas was changed; waiting for the workers.
	ScaleRequestScaling ScaleRequestPhase = "Scaling"
	// ScaleRequestSucceeded: the job reached the target.
	ScaleRequestSucceeded ScaleRequestPhase = "Succeeded"
	// ScaleRequestRefused: the request would cross min/max, an HPA owns the
	// job's size, or the job does not exist.
	ScaleRequestRefused ScaleRequestPhase = "Refused"
	// ScaleRequestRolledBack: the timeout passed; spec.replicas was restored.
	ScaleRequestRolledBack ScaleRequestPhase = "RolledBack"
	// ScaleRequestTimedOut: the timeout passed (ScaleIn: nothing to restore).
	ScaleRequestTimedOut ScaleRequestPhase = "TimedOut"
)

// ScaleRequestStatus is the outcome of a scale request.
type ScaleRequestStatus struct {
	// phase is Scaling, Succeeded, Refused, RolledBack or TimedOut.
	// +optional
	Phase ScaleRequestPhase `json:"phase,omitempty"`
	// message says what happened, naming the limit when refused.
	// +optional
	Message string `json:"message,omitempty"`
	// previousReplicas is spec.replicas before the change.
	// +optional
	PreviousReplicas int32 `json:"previousReplicas,omitempty"`
	// targetReplicas is spec.replicas after the change.
	// +optional
	TargetReplicas int32 `json:"targetReplicas,omitempty"`
	// startTime is when the change was made.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// completionTime is when the request ended.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// ScaleOut asks to add workers to an ElasticJob (Arena's `scaleout etjob`).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=so,categories=all
// +kubebuilder:printcolumn:name="Job",type=string,JSONPath=`.spec.job`
// +kubebuilder:printcolumn:name="Count",type=integer,JSONPath=`.spec.count`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ScaleOut struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ScaleRequestSpec   `json:"spec"`
	Status ScaleRequestStatus `json:"status,omitempty"`
}

// ScaleOutList is a list of ScaleOuts.
// +kubebuilder:object:root=true
type ScaleOutList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ScaleOut `json:"items"`
}

// ScaleIn asks to remove workers from an ElasticJob (Arena's `scalein etjob`).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=si,categories=all
// +kubebuilder:printcolumn:name="Job",type=string,JSONPath=`.spec.job`
// +kubebuilder:printcolumn:name="Count",type=integer,JSONPath=`.spec.count`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ScaleIn struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ScaleRequestSpec   `json:"spec"`
	Status ScaleRequestStatus `json:"status,omitempty"`
}

// ScaleInList is a list of ScaleIns.
// +kubebuilder:object:root=true
type ScaleInList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ScaleIn `json:"items"`
}

// Request returns the spec and status of the request (ScaleOut and ScaleIn
// share them), so one reconciler serves both kinds.
func (s *ScaleOut) Request() (*ScaleRequestSpec, *ScaleRequestStatus) { return &s.Spec, &s.Status }

// Request returns the spec and status of the request.
func (s *ScaleIn) Request() (*ScaleRequestSpec, *ScaleRequestStatus) { return &s.Spec, &s.Status }
