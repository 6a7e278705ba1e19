// Command vmi2domain turns a VMI manifest into the libvirt domain XML that a
// patched KubeVirt tree's virt-launcher converter makes of it, and runs the
// launcher's overlay steps on its overlay volumes. It is built inside the
// patched tree (testenv.BuildVMI2Domain copies nothing into it: it builds
// this file with `go build -overlay`), so it exercises the patched packages
// themselves.
//
// Paths: the converter names paths of the virt-launcher compute container
// (/var/run/kubevirt-private/..., /dev/overlay-...), which do not exist on a
// test host. Each -map old=new rewrites the path prefix old to new: the
// overlay creator resolves paths through the mapping (while the images it
// writes still name the container's paths, as in a pod), and the disk sources
// of the printed domain are rewritten on the typed domain after conversion.
// The converter itself runs unchanged on the container's paths.
//
// Usage:
//
//	vmi2domain -vmi vmi.yaml [-map /var/run/kubevirt-private=/tmp/x]... [-prepare] [-cleanup]
//
// -prepare creates or validates the overlays first (the pre-start step) and
// fails with the launcher's refusal; -cleanup removes the ephemeral overlays
// (the teardown step) and prints nothing.
package main

import (
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"

	"sigs.k8s.io/yaml"

	v1 "kubevirt.io/api/core/v1"

	ephemeraldisk "kubevirt.io/kubevirt/pkg/ephemeral-disk"
	diskutils "kubevirt.io/kubevirt/pkg/ephemeral-disk-utils"
	"kubevirt.io/kubevirt/pkg/storage/overlay"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	archconverter "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"
	convertertypes "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/types"
)

type pathMap []string

func (m *pathMap) String() string { return strings.Join(*m, ",") }

func (m *pathMap) Set(value string) error {
	if !strings.Contains(value, "=") {
		return fmt.Errorf("%q is not old=new", value)
	}
	*m = append(*m, value)
	return nil
}

// resolve rewrites the longest matching prefix of path.
func (m pathMap) resolve(path string) string {
	best, replacement := "", ""
	for _, entry := range m {
		old, repl, _ := strings.Cut(entry, "=")
		if (path == old || strings.HasPrefix(path, old+"/")) && len(old) > len(best) {
			best, replacement = old, repl
		}
	}
	if best == "" {
		return path
	}
	return replacement + strings.TrimPrefix(path, best)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vmi2domain:", err)
		os.Exit(1)
	}
}

func run() error {
	var paths pathMap
	vmiFile := flag.String("vmi", "", "VMI manifest (YAML or JSON)")
	prepare := flag.Bool("prepare", false, "create or validate the overlays before printing the domain")
	cleanup := flag.Bool("cleanup", false, "remove the ephemeral overlays and print nothing")
	flag.Var(&paths, "map", "old=new: find the compute container's path prefix old at new (repeatable)")
	flag.Parse()
	if *vmiFile == "" {
		return errors.New("-vmi is required")
	}

	data, err := os.ReadFile(*vmiFile)
	if err != nil {
		return err
	}
	vmi := &v1.VirtualMachineInstance{}
	if err := yaml.UnmarshalStrict(data, vmi); err != nil {
		return fmt.Errorf("parse %s: %w", *vmiFile, err)
	}
	v1.SetObjectDefaults_VirtualMachineInstance(vmi)

	// Images belong to the user running the tool, not to a qemu user the
	// test host does not have.
	diskutils.MockDefaultOwnershipManager()
	creator := ephemeraldisk.NewOverlayDiskCreatorWithPathMapping(paths.resolve)
	if *cleanup {
		return creator.RemoveEphemeralOverlays(vmi)
	}
	if *prepare {
		if err := creator.CreateOverlayImages(vmi); err != nil {
			return err
		}
	}

	domain, err := convert(vmi, paths)
	if err != nil {
		return err
	}
	out, err := xml.MarshalIndent(domain.Spec, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(out))
	return err
}

func convert(vmi *v1.VirtualMachineInstance, paths pathMap) (*api.Domain, error) {
	// As virt-launcher's generateConverterContext: an overlay's claims are in
	// Block mode when their device exists.
	isBlock := map[string]bool{}
	for _, volume := range vmi.Spec.Volumes {
		if volume.Overlay == nil {
			continue
		}
		isBlock[overlay.BackingPodVolumeName(volume.Name)] = isBlockDevice(paths.resolve(overlay.BackingDevicePath(volume.Name)))
		if overlay.HasTarget(volume.Overlay) {
			isBlock[overlay.TargetPodVolumeName(volume.Name)] = isBlockDevice(paths.resolve(overlay.TargetDevicePath(volume.Name)))
		}
	}
	c := &convertertypes.ConverterContext{
		Architecture:   archconverter.NewConverter(runtime.GOARCH),
		VirtualMachine: vmi,
		AllowEmulation: true,
		IsBlockPVC:     isBlock,
	}
	domain := &api.Domain{}
	if err := converter.Convert_v1_VirtualMachineInstance_To_api_Domain(vmi, domain, c); err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}

	checker := converter.NewDirectIOChecker()
	for i := range domain.Spec.Devices.Disks {
		disk := &domain.Spec.Devices.Disks[i]
		mapSource(&disk.Source, paths)
		if disk.BackingStore != nil && disk.BackingStore.Source != nil {
			mapSource(disk.BackingStore.Source, paths)
		}
		// As virt-launcher's pre-start hook, on the paths QEMU will open.
		if err := converter.SetDriverCacheMode(disk, checker); err != nil {
			return nil, err
		}
		converter.SetOptimalIOMode(disk, converter.IsPreAllocated)
	}
	return domain, nil
}

func mapSource(source *api.DiskSource, paths pathMap) {
	if source.File != "" {
		source.File = paths.resolve(source.File)
	}
	if source.Dev != "" {
		source.Dev = paths.resolve(source.Dev)
	}
}

func isBlockDevice(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode()&os.ModeDevice != 0 && info.Mode()&os.ModeCharDevice == 0
}
