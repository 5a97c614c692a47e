package cli

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	etjobv1 "github.com/etjob/etjob/api/v1alpha1"
	"github.com/etjob/etjob/internal/scheme"
)

// TestScaleWaitsRideOverTransientErrors: both waits, for a scale-out's
// outcome (scaleout, scalein: the request is read) and for the membership
// (scale: the job is read), read again after an API server that is busy or
// unreachable for a moment, and end at once on any other error. The API
// server is controller-runtime's fake client with interceptor.Funcs.
func TestScaleWaitsRideOverTransientErrors(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	refused := fmt.Errorf("Get \"https://127.0.0.1:6443/\": dial tcp: %w", syscall.ECONNREFUSED)
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "etjob.dev", Resource: "scaleouts"}, "x", fmt.Errorf("no"))
	cases := map[string]struct {
		fail    []error // the waited object's first reads fail with these
		wantErr string  // "" for success
		warns   int     // "trying again" warnings printed
	}{
		"no failure":                     {},
		"two transient failures":         {fail: []error{unavailable, refused}, warns: 1},
		"transient, then fine, then one": {fail: []error{unavailable, nil, refused}, warns: 2},
		"forbidden ends the wait":        {fail: []error{forbidden}, wantErr: "forbidden"},
	}
	for _, verb := range []string{verbScaleOut, verbScale} {
		for name, tc := range cases {
			t.Run(verb+"/"+name, func(t *testing.T) {
				job := &etjobv1.ElasticJob{ObjectMeta: metav1.ObjectMeta{Name: "digits", Namespace: "default"}}
				reads := 0
				c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(job).
					WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
						req, isReq := obj.(*etjobv1.ScaleOut)
						j, isJob := obj.(*etjobv1.ElasticJob)
						if verb == verbScaleOut && !isReq || verb == verbScale && !isJob {
							return c.Get(ctx, key, obj, opts...)
						}
						reads++
						if reads <= len(tc.fail) && tc.fail[reads-1] != nil {
							return tc.fail[reads-1]
						}
						if err := c.Get(ctx, key, obj, opts...); err != nil {
							return err
						}
						if reads > len(tc.fail) {
							if isReq {
								req.Status.Phase = etjobv1.ScaleRequestSucceeded
							} else {
								j.Status.Members = 3
							}
						}
						return nil
					}}).Build()
				f, _, errOut := testFactory()
				f.clients = &Clients{Client: c, Namespace: "default"}
				o := &ScaleOptions{Verb: verb, Name: "digits", Count: 1, Timeout: time.Minute, Poll: time.Millisecond,
					factory: f, clients: f.clients}
				var err error
				if verb == verbScaleOut {
					err = o.request(context.Background(), job, 2, 3)
				} else {
					err = o.wait(context.Background(), job, 2, 3)
				}
				if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
					t.Fatalf("err = %v, want %q (stderr:\n%s)", err, tc.wantErr, errOut)
				}
				if got := strings.Count(errOut.String(), "trying again"); got != tc.warns {
					t.Errorf("%d warnings, want %d:\n%s", got, tc.warns, errOut)
				}
			})
		}
	}
	if !transient(fmt.Errorf("wrapped: %w", syscall.ECONNRESET)) || transient(apierrors.NewNotFound(schema.GroupResource{}, "x")) {
		t.Error("transient: a reset connection is transient, NotFound is not")
	}
}
