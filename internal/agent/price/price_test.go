package price_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/etjob/etjob/internal/agent/price"
	"github.com/etjob/etjob/internal/emucloud"
)

func TestLocalMarket(t *testing.T) {
	md := emucloud.New()
	srv := httptest.NewServer(md)
	defer srv.Close()
	src, err := price.New(price.Local, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := src.Price(context.Background()); ok || err != nil {
		t.Errorf("before any price: ok %v, err %v; want no price and no error", ok, err)
	}
	md.SetSpotPrice("1.25")
	if p, ok, err := src.Price(context.Background()); !ok || err != nil || p != 1.25 {
		t.Errorf("Price() = %v, %v, %v; want 1.25", p, ok, err)
	}
	md.SetSpotPrice("dear")
	if _, _, err := src.Price(context.Background()); err == nil {
		t.Error("a price that is no number: no error")
	}
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	defer broken.Close()
	if _, _, err := (&price.LocalMarket{BaseURL: broken.URL}).Price(context.Background()); err == nil {
		t.Error("a 502: no error")
	}
}

func TestNew(t *testing.T) {
	if s, err := price.New(price.None, ""); s != nil || err != nil {
		t.Errorf("none: %v, %v", s, err)
	}
	if _, err := price.New(price.Local, ""); err == nil {
		t.Error("local without a URL: no error")
	}
	if _, err := price.New("ec2", "http://x"); err == nil {
		t.Error("an unknown source: no error")
	}
}
