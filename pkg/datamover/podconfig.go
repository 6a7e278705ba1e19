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

package datamover

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// PodResources are the pods' requests and limits as quantities, named as
// Velero's node-agent configuration names them; empty ones stay unset.
type PodResources struct {
	CPURequest, MemoryRequest, CPULimit, MemoryLimit string
}

// Requirements checks the quantities and that no request exceeds its
// limit.
func (p PodResources) Requirements() (corev1.ResourceRequirements, error) {
	var req corev1.ResourceRequirements
	for _, q := range []struct {
		flag, value string
		name        corev1.ResourceName
		list        *corev1.ResourceList
	}{
		{"cpu-request", p.CPURequest, corev1.ResourceCPU, &req.Requests},
		{"memory-request", p.MemoryRequest, corev1.ResourceMemory, &req.Requests},
		{"cpu-limit", p.CPULimit, corev1.ResourceCPU, &req.Limits},
		{"memory-limit", p.MemoryLimit, corev1.ResourceMemory, &req.Limits},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil {
			return req, fmt.Errorf("pod %s %q: %w", q.flag, q.value, err)
		}
		if v.Sign() <= 0 {
			return req, fmt.Errorf("pod %s %q: want a positive quantity", q.flag, q.value)
		}
		if *q.list == nil {
			*q.list = corev1.ResourceList{}
		}
		(*q.list)[q.name] = v
	}
	for name, request := range req.Requests {
		if limit, ok := req.Limits[name]; ok && request.Cmp(limit) > 0 {
			return req, fmt.Errorf("pod %s request %s exceeds its limit %s", name, request.String(), limit.String())
		}
	}
	return req, nil
}

// ParseNodeSelector reads "key=value[,key=value…]", as kubectl's label
// selectors write equality; empty is none.
func ParseNodeSelector(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return nil, fmt.Errorf("node selector %q: want key=value", pair)
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("node selector key %q: %s", key, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return nil, fmt.Errorf("node selector value %q of %s: %s", value, key, strings.Join(errs, "; "))
		}
		out[key] = value
	}
	return out, nil
}

// ParseTolerations reads "key[=value][:effect][,…]", the way kubectl taint
// writes a taint: with a value the toleration matches it (Equal), without
// one any value (Exists); without an effect it tolerates every effect.
func ParseTolerations(s string) ([]corev1.Toleration, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []corev1.Toleration
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		rest, effect, _ := strings.Cut(item, ":")
		key, value, hasValue := strings.Cut(rest, "=")
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("toleration %q: key %q: %s", item, key, strings.Join(errs, "; "))
		}
		t := corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists}
		if hasValue {
			if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
				return nil, fmt.Errorf("toleration %q: value %q: %s", item, value, strings.Join(errs, "; "))
			}
			t.Operator, t.Value = corev1.TolerationOpEqual, value
		}
		switch e := corev1.TaintEffect(effect); e {
		case "", corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
			t.Effect = e
		default:
			return nil, fmt.Errorf("toleration %q: effect %q: want NoSchedule, PreferNoSchedule or NoExecute", item, effect)
		}
		out = append(out, t)
	}
	return out, nil
}

// ParseGroups reads "gid[,gid…]".
func ParseGroups(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int64
	for _, g := range strings.Split(s, ",") {
		gid, err := strconv.ParseInt(strings.TrimSpace(g), 10, 64)
		if err != nil || gid < 0 || gid > 1<<32-1 {
			return nil, fmt.Errorf("group %q: want a numeric group ID", g)
		}
		out = append(out, gid)
	}
	return out, nil
}
