// Command thinmonitor runs the patched virt-launcher's thin provisioning
// Monitor (pkg/virt-launcher/virtwrap/thinprovisioning) against a running
// libvirt domain, as virt-launcher's notifier drives it: a check on every
// domain event (block threshold, I/O error, lifecycle) and every
// thinprovisioning.PollInterval. It is built inside the patched KubeVirt tree
// (testenv.BuildInKubeVirtTree), so it runs the patched package itself.
//
// The notifier sends the disks' statuses to virt-handler and the events to
// Kubernetes; this tool prints both instead, one JSON object a line on
// standard output, whenever they change. Growing the device is left to
// whoever reads them, as it is left to virt-controller and the storage.
//
// Usage:
//
//	thinmonitor -uri qemu+unix:///... -domain name -vmi vmi.yaml -target /dev/loopN
//
// -target is the host device of the thin volume's target claim: a volume
// counts as thin on a block device when it is one, as the launcher asks of
// the claim's pod volume.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"libvirt.org/go/libvirt"
	"sigs.k8s.io/yaml"

	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/thinprovisioning"
)

// Report is one line of output.
type Report struct {
	Disks  []api.ThinDiskStatus     `json:"disks,omitempty"`
	Events []thinprovisioning.Event `json:"events,omitempty"`
	Error  string                   `json:"error,omitempty"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "thinmonitor:", err)
		os.Exit(1)
	}
}

func run() error {
	uri := flag.String("uri", "", "libvirt URI")
	name := flag.String("domain", "", "domain name")
	vmiFile := flag.String("vmi", "", "VMI manifest (YAML or JSON)")
	target := flag.String("target", "", "host device of the thin volume's target claim")
	flag.Parse()
	if *uri == "" || *name == "" || *vmiFile == "" || *target == "" {
		return errors.New("-uri, -domain, -vmi and -target are required")
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

	monitor := thinprovisioning.NewMonitor()
	monitor.Configure(vmi, func(string) bool { return isBlockDevice(*target) })
	if !monitor.Enabled() {
		return fmt.Errorf("no thin provisioned volume on a block device in %s", *vmiFile)
	}

	// libvirt wants its event loop before the connection.
	if err := libvirt.EventRegisterDefaultImpl(); err != nil {
		return err
	}
	go func() {
		for libvirt.EventRunDefaultImpl() == nil {
		}
	}()
	conn, err := libvirt.NewConnect(*uri)
	if err != nil {
		return err
	}
	defer conn.Close()
	dom, err := conn.LookupDomainByName(*name)
	if err != nil {
		return err
	}
	defer dom.Free()

	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for _, register := range []func() (int, error){
		func() (int, error) {
			return conn.DomainEventBlockThresholdRegister(dom, func(*libvirt.Connect, *libvirt.Domain, *libvirt.DomainEventBlockThreshold) { poke() })
		},
		func() (int, error) {
			return conn.DomainEventIOErrorReasonRegister(dom, func(*libvirt.Connect, *libvirt.Domain, *libvirt.DomainEventIOErrorReason) { poke() })
		},
		func() (int, error) {
			return conn.DomainEventLifecycleRegister(dom, func(*libvirt.Connect, *libvirt.Domain, *libvirt.DomainEventLifecycle) { poke() })
		},
	} {
		id, err := register()
		if err != nil {
			return fmt.Errorf("register domain event: %w", err)
		}
		defer func() { _ = conn.DomainEventDeregister(id) }()
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	ticker := time.NewTicker(thinprovisioning.PollInterval)
	defer ticker.Stop()
	out := json.NewEncoder(os.Stdout)
	var last Report
	poke()
	for {
		select {
		case <-stop:
			return nil
		case <-wake:
		case <-ticker.C:
		}
		disks, events, err := monitor.Check(dom)
		report := Report{Disks: disks, Events: events}
		if err != nil {
			report.Error = err.Error()
		}
		if len(events) == 0 && reflect.DeepEqual(report, last) {
			continue
		}
		last = report
		if err := out.Encode(report); err != nil {
			return err
		}
	}
}

func isBlockDevice(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode()&os.ModeDevice != 0 && info.Mode()&os.ModeCharDevice == 0
}
