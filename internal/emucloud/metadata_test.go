package emucloud_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/etjob/etjob/internal/emucloud"
)

// TestUnknownProvider panics with the provider's name: it is a programming
// error, and a silent no-op would make a test wait for a notice that never
// comes.
func TestUnknownProvider(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), `"oracle"`) {
			t.Errorf("SetReclaim(oracle) recovered %v, want a panic naming it", r)
		}
	}()
	emucloud.New().SetReclaim("oracle", time.Now())
}

// TestClear withdraws every provider's notice at once.
func TestClear(t *testing.T) {
	emu := emucloud.New()
	srv := httptest.NewServer(emu)
	defer srv.Close()
	emu.SetReclaim(emucloud.Alibaba, time.Date(2015, 1, 5, 18, 2, 0, 0, time.UTC))
	emu.SetReclaim(emucloud.GCP, time.Time{})
	get := func(path string, h http.Header) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 64)
		n, _ := resp.Body.Read(buf)
		return resp.StatusCode, string(buf[:n])
	}
	gcp := http.Header{"Metadata-Flavor": {"Google"}}
	if code, body := get("/latest/meta-data/instance/spot/termination-time", nil); code != 200 || body != "2015-01-05T18:02:00Z" {
		t.Errorf("alibaba termination-time = %d %q, want 200 2015-01-05T18:02:00Z", code, body)
	}
	if _, body := get("/computeMetadata/v1/instance/preempted", gcp); body != "TRUE" {
		t.Errorf("gcp preempted = %q, want TRUE", body)
	}
	emu.Clear()
	if code, _ := get("/latest/meta-data/instance/spot/termination-time", nil); code != 404 {
		t.Errorf("alibaba termination-time after Clear = %d, want 404", code)
	}
	if _, body := get("/computeMetadata/v1/instance/preempted", gcp); body != "FALSE" {
		t.Errorf("gcp preempted after Clear = %q, want FALSE", body)
	}
}
