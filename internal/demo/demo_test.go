package demo

import (
	"context"
	"errors"
	"testing"
)

func TestBeside(t *testing.T) {
	started := make(chan struct{})
	wait := Beside(context.Background(), func(ctx context.Context) (float64, error) {
		close(started)
		return 0.97, nil
	})
	<-started
	for range 2 { // a second wait gives the same answer instead of blocking
		if acc, err := wait(); acc != 0.97 || err != nil {
			t.Fatalf("wait() = %v, %v; want 0.97, nil", acc, err)
		}
	}
	boom := errors.New("boom")
	if _, err := Beside(context.Background(), func(context.Context) (float64, error) { return 0, boom })(); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
}
