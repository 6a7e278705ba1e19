//go:build bench

/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

package hooks_test

import (
	"bufio"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	k8sv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	archconverter "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/hooks/overlay/sidecar"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// BenchmarkOnDefineDomain measures OnDefineDomain as virt-launcher sees it,
// inside KubeVirt's hook manager, for the same overlay through two paths,
// one call of each per iteration: this sidecar serving gRPC, and KubeVirt's
// sidecar-shim exec'ing this binary as onDefineDomain. The domain is what
// KubeVirt's converter renders for a VMI with 13 disks; every call
// validates the persistent overlay of the root disk (header, metadata
// check, backing identity) and edits the domain. Run with
// -benchtime=1000x for a p99 worth the name.
func BenchmarkOnDefineDomain(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for a private mount namespace")
	}
	dir := b.TempDir()
	hook := filepath.Join(dir, "overlay-hook")
	client := filepath.Join(dir, "hookclient")
	shim := filepath.Join(dir, "sidecar-shim")
	benchBuild(b, hook, "./hooks/overlay", "CGO_ENABLED=0")
	benchBuild(b, client, "./tests/hooks/hookclient")
	benchBuild(b, shim, "kubevirt.io/kubevirt/cmd/sidecars")

	grpcPod := newBenchPod(b, filepath.Join(dir, "grpc"))
	grpcPod.start(b, hook)
	grpcCall := grpcPod.serve(b, client)

	shimPod := newBenchPod(b, filepath.Join(dir, "shim"))
	shimPod.startShim(b, hook, shim, client)
	shimCall := shimPod.serve(b, client)

	// The first calls create the overlays.
	grpcCall(b)
	shimCall(b)
	var viaGRPC, viaShim []time.Duration
	for b.Loop() {
		viaGRPC = append(viaGRPC, grpcCall(b))
		viaShim = append(viaShim, shimCall(b))
	}
	g50, g99 := percentiles(viaGRPC)
	s50, s99 := percentiles(viaShim)
	b.ReportMetric(ms(g50), "grpc-p50-ms")
	b.ReportMetric(ms(g99), "grpc-p99-ms")
	b.ReportMetric(ms(s50), "shim-p50-ms")
	b.ReportMetric(ms(s99), "shim-p99-ms")
	b.ReportMetric(float64(s50)/float64(g50), "shim/grpc-p50")
	b.ReportMetric(float64(s99)/float64(g99), "shim/grpc-p99")
	b.Logf("OnDefineDomain through KubeVirt's hook manager, %d calls each, domain of %d bytes:\n"+
		"  path   p50        p99\n  gRPC   %-10v %v\n  shim   %-10v %v\n  ratio  %-10.2f %.2f",
		len(viaGRPC), len(grpcPod.domain), g50, g99, s50, s99, float64(s50)/float64(g50), float64(s99)/float64(g99))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.50), at(0.99)
}

func benchBuild(b *testing.B, out, pkg string, env ...string) {
	b.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), env...)
	if output, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build %s: %v\n%s", pkg, err, output)
	}
}

type benchPod struct {
	pod
	vmi, domain []byte
}

// newBenchPod lays out a pod whose golden image is on the sidecar's PVC.
func newBenchPod(b *testing.B, dir string) *benchPod {
	b.Helper()
	p := &benchPod{pod: pod{dir: dir, runDir: filepath.Join(dir, "run"), store: filepath.Join(dir, "store")}}
	p.socketDir = filepath.Join(p.runDir, "kubevirt-hooks", "hook-sidecar-0")
	p.golden = filepath.Join(p.store, "disk.img")
	for _, d := range []string{p.socketDir, p.store} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(p.golden, []byte("golden"), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(p.golden, 1<<30); err != nil {
		b.Fatal(err)
	}
	p.vmi, p.domain = benchVMI(b, p.store)
	return p
}

// benchVMI returns a VMI with 13 disks, the root disk on the sidecar's
// claim, and the domain KubeVirt's converter renders for it.
func benchVMI(b *testing.B, store string) ([]byte, []byte) {
	b.Helper()
	sidecars, err := json.Marshal(hooks.HookSidecarList{{PVC: &hooks.PVC{Name: "golden-store", VolumePath: store, SharedComputePath: store}}})
	if err != nil {
		b.Fatal(err)
	}
	vmi := &v1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default", UID: "0d6b3b5e-1c2a-4b8e-9f3a-2a7c5e9d1f00",
		Annotations: map[string]string{
			hooks.HookSidecarListAnnotationName: string(sidecars),
			sidecar.AnnotationKey:               `{"disks":[{"name":"rootdisk","persistent":true}]}`,
		}}}
	pvc := func(name, claim string) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: k8sv1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	}
	addDisk := func(name string, bus v1.DiskBus, vol v1.Volume) {
		vmi.Spec.Domain.Devices.Disks = append(vmi.Spec.Domain.Devices.Disks, v1.Disk{Name: name, DiskDevice: v1.DiskDevice{Disk: &v1.DiskTarget{Bus: bus}}})
		vol.Name = name
		vmi.Spec.Volumes = append(vmi.Spec.Volumes, vol)
	}
	addDisk("rootdisk", v1.DiskBusVirtio, pvc("", "golden-store"))
	for i := range 9 {
		addDisk(fmt.Sprintf("data%d", i), v1.DiskBusVirtio, pvc("", fmt.Sprintf("data-%d", i)))
	}
	for i := range 2 {
		addDisk(fmt.Sprintf("scratch%d", i), v1.DiskBusSCSI, v1.Volume{VolumeSource: v1.VolumeSource{EmptyDisk: &v1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
	}
	vmi.Spec.Domain.Devices.Disks = append(vmi.Spec.Domain.Devices.Disks, v1.Disk{Name: "cloudinit", DiskDevice: v1.DiskDevice{CDRom: &v1.CDRomTarget{Bus: v1.DiskBusSATA}}})
	vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1.Volume{Name: "cloudinit", VolumeSource: v1.VolumeSource{CloudInitNoCloud: &v1.CloudInitNoCloudSource{UserData: "#cloud-config\n"}}})
	v1.SetObjectDefaults_VirtualMachineInstance(vmi)

	domain := &api.Domain{}
	c := &converter.ConverterContext{VirtualMachine: vmi, Architecture: archconverter.NewConverter(runtime.GOARCH), AllowEmulation: true}
	if err := converter.Convert_v1_VirtualMachineInstance_To_api_Domain(vmi, domain, c); err != nil {
		b.Fatal(err)
	}
	api.NewDefaulter(runtime.GOARCH).SetObjectDefaults_Domain(domain)
	domainXML, err := xml.MarshalIndent(domain.Spec, "", "\t")
	if err != nil {
		b.Fatal(err)
	}
	vmiJSON, err := json.Marshal(vmi)
	if err != nil {
		b.Fatal(err)
	}
	return vmiJSON, domainXML
}

// start runs this repository's sidecar serving gRPC.
func (p *benchPod) start(b *testing.B, hook string) {
	b.Helper()
	cmd := exec.Command(hook, "--socket-dir", p.socketDir, "--compute-socket-dir", p.socketDir, "--container-name", "hook-sidecar-0")
	benchStart(b, cmd)
	waitFor(b, filepath.Join(p.socketDir, "overlay.sock"))
}

// startShim runs KubeVirt's sidecar-shim with the hook as onDefineDomain,
// with /var/run/kubevirt-hooks being the pod's socket directory.
func (p *benchPod) startShim(b *testing.B, hook, shim, client string) {
	b.Helper()
	binDir := filepath.Join(p.dir, "bin")
	shimRun := filepath.Join(p.dir, "shim-run")
	for _, d := range []string{binDir, shimRun} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.Symlink(hook, filepath.Join(binDir, sidecar.ShimOnDefineDomain)); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(p.socketDir, filepath.Join(shimRun, "kubevirt-hooks")); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", client, "exec", "--run-dir", shimRun, "--", shim, "--version", "v1alpha3")
	cmd.Env = append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"), "CONTAINER_NAME=hook-sidecar-0",
		"OVERLAY_HOOK_SOCKET_DIR="+p.socketDir, "OVERLAY_HOOK_COMPUTE_SOCKET_DIR="+p.socketDir)
	benchStart(b, cmd)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m, _ := filepath.Glob(filepath.Join(p.socketDir, "shim-*.sock")); len(m) == 1 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("sidecar-shim did not create its socket")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serve starts hookclient serve for the pod and returns a function that
// makes one OnDefineDomain call and returns the manager's time for it.
func (p *benchPod) serve(b *testing.B, client string) func(*testing.B) time.Duration {
	b.Helper()
	vmiFile, domFile := filepath.Join(p.dir, "vmi.json"), filepath.Join(p.dir, "domain.xml")
	if err := os.WriteFile(vmiFile, p.vmi, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(domFile, p.domain, 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", client, "serve",
		"--run-dir", p.runDir, "--vmi", vmiFile, "--domain", domFile)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	benchStart(b, cmd)
	b.Cleanup(func() { stdin.Close() })
	lines := bufio.NewReader(stdout)
	return func(b *testing.B) time.Duration {
		if _, err := io.WriteString(stdin, "\n"); err != nil {
			b.Fatal(err)
		}
		line, err := lines.ReadString('\n')
		if err != nil {
			b.Fatalf("hookclient: %v", err)
		}
		line = strings.TrimSpace(line)
		ns, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			b.Fatalf("hookclient: %s", line)
		}
		return time.Duration(ns)
	}
}

func benchStart(b *testing.B, cmd *exec.Cmd) {
	b.Helper()
	if cmd.Stderr == nil {
		cmd.Stderr = io.Discard
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
}

func waitFor(b *testing.B, path string) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s did not appear", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
