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

package sidecar

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// The parts of KubeVirt's VirtualMachineInstance (kubevirt.io/api/core/v1)
// the hook reads, decoded without importing the API packages: their
// package initialisation would cost every sidecar-shim exec milliseconds.

type vmiObject struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Domain struct {
			Devices struct {
				Disks []struct {
					Name string `json:"name"`
				} `json:"disks"`
			} `json:"devices"`
		} `json:"domain"`
		Volumes []vmiVolume `json:"volumes"`
	} `json:"spec"`
	Status struct {
		Phase          string `json:"phase"`
		MigrationState *struct {
			TargetPod string `json:"targetPod"`
			Completed bool   `json:"completed"`
		} `json:"migrationState"`
	} `json:"status"`
}

type vmiVolume struct {
	Name                  string `json:"name"`
	PersistentVolumeClaim *struct {
		ClaimName    string `json:"claimName"`
		Hotpluggable bool   `json:"hotpluggable"`
	} `json:"persistentVolumeClaim"`
	DataVolume *struct {
		Name         string `json:"name"`
		Hotpluggable bool   `json:"hotpluggable"`
	} `json:"dataVolume"`
}

// claimName is the PVC behind a volume, or "".
func (v vmiVolume) claimName() string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.DataVolume != nil:
		// A DataVolume's PVC has the DataVolume's name.
		return v.DataVolume.Name
	}
	return ""
}

func (v vmiVolume) hotpluggable() bool {
	return (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.Hotpluggable) ||
		(v.DataVolume != nil && v.DataVolume.Hotpluggable)
}

func parseVMI(data []byte) (*vmiObject, error) {
	v := &vmiObject{}
	if err := json.Unmarshal(data, v); err != nil {
		return nil, fmt.Errorf("parse VMI: %w", err)
	}
	if v.Metadata.Name == "" {
		return nil, fmt.Errorf("parse VMI: no metadata.name")
	}
	return v, nil
}

func (v *vmiObject) hasDisk(name string) bool {
	for _, d := range v.Spec.Domain.Devices.Disks {
		if d.Name == name {
			return true
		}
	}
	return false
}

func (v *vmiObject) volume(name string) (vmiVolume, bool) {
	for _, vol := range v.Spec.Volumes {
		if vol.Name == name {
			return vol, true
		}
	}
	return vmiVolume{}, false
}

// migrationTargetOf reports whether the VMI is being migrated into pod:
// virt-launcher calls OnDefineDomain in the target pod to prepare it, but
// defines the domain the source sends.
func (v *vmiObject) migrationTargetOf(pod string) bool {
	m := v.Status.MigrationState
	if m != nil && !m.Completed && pod != "" && m.TargetPod == pod {
		return true
	}
	// A first start defines the domain before the VMI runs.
	return v.Status.Phase == "Running"
}

// hookSidecarsAnnotation lists a VMI's hook sidecars
// (kubevirt.io/kubevirt/pkg/hooks.HookSidecarListAnnotationName).
const hookSidecarsAnnotation = "hooks.kubevirt.io/hookSidecars"

// sidecarPVC is the `pvc` field of a hook sidecar: one claim mounted at
// VolumePath in the sidecar and at SharedComputePath in the compute
// container.
type sidecarPVC struct {
	Name              string `json:"name"`
	VolumePath        string `json:"volumePath"`
	SharedComputePath string `json:"sharedComputePath"`
}

// ownPVC finds this sidecar's PVC. virt-controller names the sidecar
// containers "hook-sidecar-<i>" after their index in the hookSidecars
// annotation (pkg/virt-controller/services/template.go), and passes the
// name in CONTAINER_NAME.
func (v *vmiObject) ownPVC(containerName string) (*sidecarPVC, error) {
	idx, ok := strings.CutPrefix(containerName, "hook-sidecar-")
	i, err := strconv.Atoi(idx)
	if !ok || err != nil || i < 0 {
		return nil, fmt.Errorf("container name %q is not hook-sidecar-<index>: cannot find this sidecar in %s", containerName, hookSidecarsAnnotation)
	}
	raw, ok := v.Metadata.Annotations[hookSidecarsAnnotation]
	if !ok {
		return nil, fmt.Errorf("annotation %s is missing", hookSidecarsAnnotation)
	}
	var list []struct {
		PVC *sidecarPVC `json:"pvc"`
	}
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", hookSidecarsAnnotation, err)
	}
	if i >= len(list) {
		return nil, fmt.Errorf("annotation %s has no entry %d for container %s", hookSidecarsAnnotation, i, containerName)
	}
	pvc := list[i].PVC
	switch {
	case pvc == nil:
		return nil, fmt.Errorf("persistent overlays and configured backings live in the sidecar's PVC, but entry %d of %s has no \"pvc\"", i, hookSidecarsAnnotation)
	case !path.IsAbs(pvc.VolumePath) || !path.IsAbs(pvc.SharedComputePath):
		return nil, fmt.Errorf("entry %d of %s: pvc needs absolute volumePath and sharedComputePath, has %q and %q",
			i, hookSidecarsAnnotation, pvc.VolumePath, pvc.SharedComputePath)
	}
	return pvc, nil
}
