package demo

import (
	"context"
	"time"
)

// Submit creates the digits example's PV, PVC and ElasticJob with the given
// desired workers (min 2, max replicas+2), as the story does; `etjob chaos`
// drives its own schedule on it.
func Submit(ctx context.Context, o Options, replicas int) error {
	s, err := newStory(o)
	if err != nil {
		return err
	}
	return s.submitSized(ctx, replicas)
}

func newStory(o Options) (*story, error) {
	cs, err := o.Cluster.Clientset()
	if err != nil {
		return nil, err
	}
	c, err := newClient(o)
	if err != nil {
		return nil, err
	}
	return &story{Options: o, cs: cs, c: c, start: time.Now(), res: &Result{}, seconds: map[string]float64{}, prices: map[string]float64{}}, nil
}
