package adminui_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// A WebDriver client, just what the browser test needs, driving Debian's
// chromium through chromedriver (packages chromium and chromium-driver,
// which .ci/run installs).

const chromeDriverPath = "/usr/bin/chromedriver"

type browser struct {
	t       *testing.T
	base    string // chromedriver's URL
	session string
}

// newBrowser starts chromedriver and a headless chromium session; both end
// with the test.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	if _, err := os.Stat(chromeDriverPath); err != nil {
		t.Fatalf("%s: %v (install Debian's chromium and chromium-driver; .ci/run does)", chromeDriverPath, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(chromeDriverPath, "--port="+strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		t.Fatalf("start chromedriver: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	b := &browser{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var status struct{ Ready bool }
		if err := b.call("GET", "/status", nil, &status); err == nil && status.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("chromedriver did not become ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var session struct {
		SessionID string `json:"sessionId"`
	}
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{
			"binary": "/usr/bin/chromium",
			"args":   []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"},
		},
	}}}
	if err := b.call("POST", "/session", caps, &session); err != nil {
		t.Fatalf("start a browser session: %v", err)
	}
	b.session = session.SessionID
	t.Cleanup(func() { _ = b.call("DELETE", "/session/"+b.session, nil, nil) })
	return b
}

// call sends a WebDriver command and decodes its "value" into out.
func (b *browser) call(method, path string, body, out any) error {
	var rd *bytes.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, b.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, env.Value)
	}
	if out != nil {
		return json.Unmarshal(env.Value, out)
	}
	return nil
}

func (b *browser) must(err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatal(err)
	}
}

func (b *browser) open(url string) {
	b.t.Helper()
	b.must(b.call("POST", "/session/"+b.session+"/url", map[string]string{"url": url}, nil))
}

// find returns the id of the element css selects, failing the test when
// there is none.
func (b *browser) find(css string) string {
	b.t.Helper()
	var el map[string]string
	if err := b.call("POST", "/session/"+b.session+"/element", map[string]string{"using": "css selector", "value": css}, &el); err != nil {
		b.t.Fatalf("find %s: %v", css, err)
	}
	for _, id := range el {
		return id
	}
	b.t.Fatalf("find %s: no element id", css)
	return ""
}

// count is how many elements css selects.
func (b *browser) count(css string) int {
	b.t.Helper()
	var els []map[string]string
	b.must(b.call("POST", "/session/"+b.session+"/elements", map[string]string{"using": "css selector", "value": css}, &els))
	return len(els)
}

// waitFor waits until css selects an element: a click that submits a
// form or follows a link returns before the next page is there.
func (b *browser) waitFor(css string) {
	b.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for b.count(css) == 0 {
		if time.Now().After(deadline) {
			b.t.Fatalf("no %s on %s after 30s", css, b.url())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *browser) text(css string) string {
	b.t.Helper()
	var s string
	b.must(b.call("GET", "/session/"+b.session+"/element/"+b.find(css)+"/text", nil, &s))
	return s
}

func (b *browser) click(css string) {
	b.t.Helper()
	b.must(b.call("POST", "/session/"+b.session+"/element/"+b.find(css)+"/click", map[string]any{}, nil))
}

// fill replaces the text of the input css selects with text.
func (b *browser) fill(css, text string) {
	b.t.Helper()
	el := b.find(css)
	b.must(b.call("POST", "/session/"+b.session+"/element/"+el+"/clear", map[string]any{}, nil))
	b.must(b.call("POST", "/session/"+b.session+"/element/"+el+"/value", map[string]any{"text": text}, nil))
}

// reload reloads the page, as the browser's button does.
func (b *browser) reload() {
	b.t.Helper()
	b.must(b.call("POST", "/session/"+b.session+"/refresh", map[string]any{}, nil))
}

func (b *browser) url() string {
	b.t.Helper()
	var s string
	b.must(b.call("GET", "/session/"+b.session+"/url", nil, &s))
	return s
}

// screenshot saves the page as a PNG at path.
func (b *browser) screenshot(path string) {
	b.t.Helper()
	var data string
	b.must(b.call("GET", "/session/"+b.session+"/screenshot", nil, &data))
	png, err := base64.StdEncoding.DecodeString(data)
	b.must(err)
	b.must(os.WriteFile(path, png, 0o644))
}

// attr returns the attribute name of the element css selects.
func (b *browser) attr(css, name string) string {
	b.t.Helper()
	var v *string
	b.must(b.call("GET", "/session/"+b.session+"/element/"+b.find(css)+"/attribute/"+name, nil, &v))
	if v == nil {
		return ""
	}
	return *v
}
