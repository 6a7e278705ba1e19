// Command cdvalidate runs virt-api's validation of VMI specs, the one a
// VM's declarative hotplug goes through, with the HotplugVolumes and
// HotplugContainerDisk feature gates on. It reads VMIs as a stream of JSON
// objects on standard input and prints, per VMI, one line with the causes
// of its refusal as a JSON list (empty when the spec is valid). It is built
// inside the patched KubeVirt tree (see tests/hotplug), apart from
// cdhotplug: virt-api's packages take seconds to initialize, so one run
// takes every VMI.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfield "k8s.io/apimachinery/pkg/util/validation/field"

	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/testutils"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook/admitters"
	"kubevirt.io/kubevirt/pkg/virt-config/featuregate"
)

func main() {
	if err := validate(); err != nil {
		fmt.Fprintln(os.Stderr, "cdvalidate:", err)
		os.Exit(1)
	}
}

func validate() error {
	kv := &v1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Name: "kubevirt", Namespace: "kubevirt"}}
	kv.Spec.Configuration.DeveloperConfiguration = &v1.DeveloperConfiguration{
		FeatureGates: []string{featuregate.HotplugVolumesGate, featuregate.HotplugContainerDiskGate},
	}
	config, _, _ := testutils.NewFakeClusterConfigUsingKV(kv)
	in, out := json.NewDecoder(os.Stdin), json.NewEncoder(os.Stdout)
	for {
		vmi := &v1.VirtualMachineInstance{}
		if err := in.Decode(vmi); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("read a VMI from standard input: %w", err)
		}
		v1.SetObjectDefaults_VirtualMachineInstance(vmi)
		causes := admitters.ValidateVirtualMachineInstanceSpec(k8sfield.NewPath("spec"), &vmi.Spec, config)
		if causes == nil {
			causes = []metav1.StatusCause{}
		}
		if err := out.Encode(causes); err != nil {
			return err
		}
	}
}
