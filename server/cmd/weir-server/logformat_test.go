package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weirlb/weir/test/kubeapi"
)

// serverArgsEnv, set in a child test process, makes it run weir-server's
// main with the arguments it holds (one a line) instead of the tests:
// the test binary is the server binary, as the product runs it.
const serverArgsEnv = "WEIR_TEST_RUN_SERVER"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(serverArgsEnv); ok {
		os.Args = append([]string{"weir-server"}, strings.Split(args, "\n")...)
		flag.CommandLine = flag.NewFlagSet("weir-server", flag.ExitOnError)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// With --log-format json every line the server writes is a JSON object,
// client-go's included: a log collector that parses JSON drops or mangles
// a plain-text line, and client-go's are the ones that say why the server
// cannot see the cluster. The server runs as a service account with no
// RBAC binding, the field's usual mistake, so client-go's reflectors log
// "forbidden" errors. SIGTERM then stops it cleanly, with status 0.
func TestJSONLogsCarryClientGoLines(t *testing.T) {
	c := kubeapi.StartForTest(t)
	kubeconfig := unboundAccountKubeconfig(t, c)

	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serverArgsEnv+"="+strings.Join([]string{
		"--insecure", "--listen", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--init", "--kubeconfig", kubeconfig,
		"--log-format", "json",
	}, "\n"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	// Read until client-go has said it is forbidden (or the server ended),
	// then stop the server with SIGTERM, as the kubelet does, and read its
	// last lines too.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var got []string
	sawForbidden := false
	deadline := time.After(60 * time.Second)
read:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				break read
			}
			got = append(got, l)
			if strings.Contains(l, "forbidden") && !sawForbidden {
				sawForbidden = true
				cmd.Process.Signal(syscall.SIGTERM)
			}
		case <-deadline:
			t.Errorf("no line said forbidden in 60 s; stopping the server")
			cmd.Process.Signal(syscall.SIGTERM)
			deadline = nil
		}
	}
	// SIGTERM is how the kubelet stops a pod: a clean stop, status 0.
	if err := cmd.Wait(); err != nil {
		t.Errorf("the server stopped on SIGTERM with %v, want status 0", err)
	}
	if testing.Verbose() {
		t.Logf("stderr:\n%s", strings.Join(got, "\n"))
	}
	if !sawForbidden {
		t.Errorf("client-go never logged a forbidden list or watch: the test did not exercise its logs")
	}
	for _, l := range got {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			t.Errorf("line is not JSON (%v): %s", err, l)
			continue
		}
		for _, key := range []string{"time", "level", "msg"} {
			if _, ok := obj[key]; !ok {
				t.Errorf("line has no %q: %s", key, l)
			}
		}
	}
}

// unboundAccountKubeconfig is c's kubeconfig with the token of a new
// service account that no role is bound to.
func unboundAccountKubeconfig(t *testing.T, c *kubeapi.Cluster) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	const account = "unbound"
	if _, err := kc.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: account}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := kc.CoreV1().ServiceAccounts("default").CreateToken(ctx, account, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, user := range cfg.AuthInfos {
		user.Token = tr.Status.Token
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
