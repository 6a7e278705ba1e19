// Command cdhotplug drives the containerDisk hotplug code of a patched
// KubeVirt tree on a test host: virt-handler's hotplug volume mounter and
// virt-launcher's converter. It is built inside the patched tree
// (tests/hotplug builds this file with `go build -overlay`), so the
// packages it calls are the patched ones, unchanged.
//
// Usage, with the VMI as JSON on standard input:
//
//	cdhotplug mount -kubelet-pods DIR -state DIR
//	cdhotplug unmount -kubelet-pods DIR -state DIR [-all]
//	cdhotplug disks -hotplug-dir DIR -ephemeral-dir DIR
//	cdhotplug unplug -ephemeral-dir DIR
//
// mount and unmount are virt-handler's steps and expect its container: the
// kubelet pods directory at /pods, the host's init as PID 1, virt-chroot at
// /usr/bin/virt-chroot. They print a JSON report (the VMI's volume status
// after the step, whether each hotplugged containerDisk is mounted, the
// device cgroup rules the mounter set, durations). A failed step exits 1
// with the mounter's error on standard error.
//
// disks is virt-launcher's step: it probes each mounted image as the
// launcher does before it converts the VMI, makes the ephemeral overlay of
// each writable one, converts the VMI, and prints the XML of every hotplug
// disk as the launcher passes it to AttachDeviceFlags, one per line. The
// pod's hotplug disk directory (v1.HotplugDiskDir) and ephemeral disk
// directory are found at the given directories. unplug is the launcher's
// removal of the overlays of writable volumes no longer in the VMI.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/devices"

	v1 "kubevirt.io/api/core/v1"

	ephemeraldisk "kubevirt.io/kubevirt/pkg/ephemeral-disk"
	diskutils "kubevirt.io/kubevirt/pkg/ephemeral-disk-utils"
	osdisk "kubevirt.io/kubevirt/pkg/os/disk"
	"kubevirt.io/kubevirt/pkg/storage/overlay"
	storagetypes "kubevirt.io/kubevirt/pkg/storage/types"
	"kubevirt.io/kubevirt/pkg/virt-handler/cgroup"
	containerdisk "kubevirt.io/kubevirt/pkg/virt-handler/container-disk"
	hotplugvolume "kubevirt.io/kubevirt/pkg/virt-handler/hotplug-disk"
	"kubevirt.io/kubevirt/pkg/virt-handler/isolation"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	archconverter "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"
	convertertypes "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/types"
)

// socketDir is where virt-handler's container has the kubelet pods
// directory, and the path virt-handler derives a hotplugged containerDisk's
// socket from: pods/<attachment pod>/volumes/kubernetes.io~empty-dir/<volume>/disk.sock.
const socketDir = "/pods"

// diskMemoryLimit bounds qemu-img when it probes an image, as virt-launcher's
// default.
const diskMemoryLimit = 1 << 30

type report struct {
	VolumeStatus []v1.VolumeStatus `json:"volumeStatus"`
	Mounted      map[string]bool   `json:"mounted"`
	// DeviceRules are the device cgroup rules the mounter set, in order.
	DeviceRules []devices.Rule `json:"deviceRules"`
	// DiscoveryNanos is the time of resolving each image from its socket
	// alone, before the step: the mounter does it again inside.
	DiscoveryNanos map[string]int64 `json:"discoveryNanos"`
	StepNanos      int64            `json:"stepNanos"`
}

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: cdhotplug mount|unmount|disks [flags] < vmi.json"))
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "mount", "unmount":
		err = handlerStep(cmd, args)
	case "disks":
		err = launcherDisks(args)
	case "unplug":
		err = launcherUnplug(args)

	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "cdhotplug:", err)
	os.Exit(1)
}

func readVMI() (*v1.VirtualMachineInstance, error) {
	vmi := &v1.VirtualMachineInstance{}
	if err := json.NewDecoder(os.Stdin).Decode(vmi); err != nil {
		return nil, fmt.Errorf("read the VMI from standard input: %w", err)
	}
	v1.SetObjectDefaults_VirtualMachineInstance(vmi)
	return vmi, nil
}

func handlerStep(cmd string, args []string) error {
	flags := flag.NewFlagSet(cmd, flag.ContinueOnError)
	kubeletPods := flags.String("kubelet-pods", "", "the kubelet pods directory on the host")
	stateDir := flags.String("state", "", "virt-handler's hotplug mount record directory")
	all := flags.Bool("all", false, "unmount: every recorded mount, as on VMI teardown")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *kubeletPods == "" || *stateDir == "" {
		return errors.New("-kubelet-pods and -state are required")
	}
	vmi, err := readVMI()
	if err != nil {
		return err
	}
	mounter := hotplugvolume.NewVolumeMounter(*stateDir, *kubeletPods, "node")
	rules := &deviceRuleRecorder{}
	out := report{Mounted: map[string]bool{}, DiscoveryNanos: map[string]int64{}}

	start := time.Now()
	switch {
	case cmd == "mount":
		out.DiscoveryNanos = discover(vmi)
		start = time.Now()
		err = mounter.Mount(vmi, rules)
	case *all:
		err = mounter.UnmountAll(vmi, rules)
	default:
		err = mounter.Unmount(vmi, rules)
	}
	out.StepNanos = time.Since(start).Nanoseconds()
	if err != nil {
		// What a failed step allowed in the device cgroup matters too.
		return fmt.Errorf("%w (device cgroup rules set: %d)", err, len(rules.rules))
	}

	for _, status := range vmi.Status.VolumeStatus {
		if status.HotplugVolume == nil {
			continue
		}
		mounted, err := mounter.IsMounted(vmi, status.Name, status.HotplugVolume.AttachPodUID)
		if err != nil {
			return fmt.Errorf("is %s mounted: %w", status.Name, err)
		}
		out.Mounted[status.Name] = mounted
	}
	out.VolumeStatus = vmi.Status.VolumeStatus
	out.DeviceRules = rules.rules
	return json.NewEncoder(os.Stdout).Encode(out)
}

// discover times the socket → process → root mount → image resolution of
// each hotplugged containerDisk with an attachment pod, with the function
// the mounter uses. A volume whose image cannot be resolved is left out:
// the mounter reports it.
func discover(vmi *v1.VirtualMachineInstance) map[string]int64 {
	times := map[string]int64{}
	for _, status := range vmi.Status.VolumeStatus {
		if status.HotplugVolume == nil || status.HotplugVolume.AttachPodUID == "" {
			continue
		}
		for i := range vmi.Spec.Volumes {
			volume := &vmi.Spec.Volumes[i]
			if volume.Name != status.Name || !storagetypes.IsHotplugContainerDisk(volume) {
				continue
			}
			socket := filepath.Join(socketDir, string(status.HotplugVolume.AttachPodUID), "volumes/kubernetes.io~empty-dir", volume.Name, "disk.sock")
			start := time.Now()
			if _, err := containerdisk.ImageForSocket(isolation.NewSocketBasedIsolationDetector(), isolation.NodeIsolationResult(), socket, volume); err == nil {
				times[volume.Name] = time.Since(start).Nanoseconds()
			}
		}
	}
	return times
}

// deviceRuleRecorder stands for the virt-launcher pod's device cgroup: on the
// test host QEMU runs in no device cgroup of its own, so the rules the
// mounter sets are recorded for the test to check instead of applied.
type deviceRuleRecorder struct {
	rules []devices.Rule
}

var errNotRecorded = errors.New("not available on the test host's stand-in cgroup")

func (r *deviceRuleRecorder) Set(resources *configs.Resources) error {
	for _, rule := range resources.Devices {
		r.rules = append(r.rules, *rule)
	}
	return nil
}

func (r *deviceRuleRecorder) GetBasePathToHostSubsystem(string) (string, error) {
	return "", errNotRecorded
}

func (r *deviceRuleRecorder) GetCgroupVersion() cgroup.CgroupVersion { return cgroup.V1 }

func (r *deviceRuleRecorder) GetCpuSet() (string, error) { return "", errNotRecorded }

func (r *deviceRuleRecorder) SetCpuSet(string, []int) error { return errNotRecorded }

func (r *deviceRuleRecorder) CreateChildCgroup(string, string) error { return errNotRecorded }

func (r *deviceRuleRecorder) AttachTID(string, string, int) error { return errNotRecorded }

func (r *deviceRuleRecorder) GetCgroupThreads() ([]int, error) { return nil, errNotRecorded }

// podPaths finds the virt-launcher pod's hotplug and ephemeral disk
// directories on the test host.
type podPaths struct {
	hotplugDir, ephemeralDir string
}

func (p podPaths) hostPath(path string) string {
	for dir, host := range map[string]string{v1.HotplugDiskDir: p.hotplugDir, ephemeralDiskDir: p.ephemeralDir} {
		if rest, ok := strings.CutPrefix(path, strings.TrimSuffix(dir, "/")+"/"); ok {
			return filepath.Join(host, rest)
		}
	}
	return path
}

// ephemeralDiskDir is the virt-launcher pod's ephemeral disk emptyDir.
const ephemeralDiskDir = "/var/run/kubevirt-ephemeral-disks"

func parsePodPaths(name string, args []string, hotplug bool) (podPaths, error) {
	var p podPaths
	flags := flag.NewFlagSet(name, flag.ContinueOnError)
	if hotplug {
		flags.StringVar(&p.hotplugDir, "hotplug-dir", "", "where the test host has the pod's hotplug disk directory")
	}
	flags.StringVar(&p.ephemeralDir, "ephemeral-dir", "", "where the test host has the pod's ephemeral disk directory")
	if err := flags.Parse(args); err != nil {
		return p, err
	}
	if (hotplug && p.hotplugDir == "") || p.ephemeralDir == "" {
		return p, errors.New("the pod's directories are required")
	}
	return p, nil
}

// hotplugOverlays is what the launcher's overlay creator does for writable
// hotplugged containerDisks.
type hotplugOverlays interface {
	CreateHotplugOverlay(volumeName, backing, backingFormat string) error
	RemoveHotplugOverlays(keep map[string]bool) error
}

// overlayCreator is the launcher's overlay creator on the test host's paths.
// Images belong to the user running the tool, not to a qemu user the test
// host does not have.
func overlayCreator(p podPaths) hotplugOverlays {
	diskutils.MockDefaultOwnershipManager()
	return ephemeraldisk.NewOverlayDiskCreatorWithPathMapping(p.hostPath)
}

func launcherUnplug(args []string) error {
	p, err := parsePodPaths("unplug", args, false)
	if err != nil {
		return err
	}
	vmi, err := readVMI()
	if err != nil {
		return err
	}
	plugged := map[string]bool{}
	for i := range vmi.Spec.Volumes {
		if storagetypes.IsWritableHotplugContainerDisk(&vmi.Spec.Volumes[i], vmi.Spec.Domain.Devices.Disks) {
			plugged[vmi.Spec.Volumes[i].Name] = true
		}
	}
	return overlayCreator(p).RemoveHotplugOverlays(plugged)
}

func launcherDisks(args []string) error {
	p, err := parsePodPaths("disks", args, true)
	if err != nil {
		return err
	}
	vmi, err := readVMI()
	if err != nil {
		return err
	}
	hostPath := p.hostPath

	c := &convertertypes.ConverterContext{
		Architecture:     archconverter.NewConverter(runtime.GOARCH),
		VirtualMachine:   vmi,
		AllowEmulation:   true,
		HotplugVolumes:   map[string]v1.VolumeStatus{},
		PermanentVolumes: map[string]v1.VolumeStatus{},
		DisksInfo:        map[string]*osdisk.DiskInfo{},
	}
	for _, status := range vmi.Status.VolumeStatus {
		if status.HotplugVolume != nil {
			c.HotplugVolumes[status.Name] = status
		} else {
			c.PermanentVolumes[status.Name] = status
		}
	}
	if err := probe(vmi, c, hostPath, overlayCreator(p)); err != nil {
		return err
	}

	domain := &api.Domain{}
	if err := converter.Convert_v1_VirtualMachineInstance_To_api_Domain(vmi, domain, c); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	checker := converter.NewDirectIOChecker()
	for _, disk := range domain.Spec.Devices.Disks {
		source := disk.Source.File
		if source == "" {
			source = disk.Source.Dev
		}
		if !strings.HasPrefix(source, v1.HotplugDiskDir) && !overlay.IsHotplugImagePath(source) {
			continue
		}
		disk.Source.File = mapIfSet(disk.Source.File, hostPath)
		disk.Source.Dev = mapIfSet(disk.Source.Dev, hostPath)
		if disk.BackingStore != nil && disk.BackingStore.Source != nil {
			disk.BackingStore.Source.File = mapIfSet(disk.BackingStore.Source.File, hostPath)
			disk.BackingStore.Source.Dev = mapIfSet(disk.BackingStore.Source.Dev, hostPath)
		}
		// As the launcher's syncDisks before it attaches a disk.
		if err := converter.SetDriverCacheMode(&disk, checker); err != nil {
			return err
		}
		converter.SetOptimalIOMode(&disk, converter.IsPreAllocated)
		data, err := disk.HotplugXML()
		if err != nil {
			return err
		}
		fmt.Println(data)
	}
	return nil
}

func mapIfSet(path string, hostPath func(string) string) string {
	if path == "" {
		return ""
	}
	return hostPath(path)
}

// probe does for the converter context what the launcher's
// probeHotplugContainerDisks does: the mounted image is probed and
// validated with the functions it uses, and a writable one gets its
// overlay.
func probe(vmi *v1.VirtualMachineInstance, c *convertertypes.ConverterContext, hostPath func(string) string, creator hotplugOverlays) error {
	mounted := map[string]bool{}
	for _, status := range vmi.Status.VolumeStatus {
		if status.HotplugVolume != nil && (status.Phase == v1.HotplugVolumeMounted || status.Phase == v1.VolumeReady) {
			mounted[status.Name] = true
		}
	}
	for i := range vmi.Spec.Volumes {
		volume := &vmi.Spec.Volumes[i]
		if !storagetypes.IsHotplugContainerDisk(volume) {
			continue
		}
		path := converter.GetHotplugFilesystemVolumePath(volume.Name)
		if !mounted[volume.Name] {
			continue
		}
		info, err := osdisk.GetDiskInfoWithValidation(hostPath(path), diskMemoryLimit)
		if err != nil {
			return fmt.Errorf("failed to get info of hotplugged containerDisk %s: %v", volume.Name, err)
		}
		if err := osdisk.VerifyImage(info); err != nil {
			return fmt.Errorf("invalid image in hotplugged containerDisk %s: %v", volume.Name, err)
		}
		c.DisksInfo[volume.Name] = info
		if storagetypes.IsWritableHotplugContainerDisk(volume, vmi.Spec.Domain.Devices.Disks) {
			if err := creator.CreateHotplugOverlay(volume.Name, path, info.Format); err != nil {
				return err
			}
		}
	}
	return nil
}
