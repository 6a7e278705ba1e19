/*
 * This file is part of the KubeVirt project
 *
 * Licensed under the Apache License, Version 2.0 (the "License");
 * you may not use this file except in compliance with the License.
 * You may obtain a copy of the License at
 *
 *     http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS,
 * WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
 * See the License for the specific language governing permissions and
 * limitations under the License.
 *
 * Copyright The KubeVirt Authors.
 *
 */

// crds writes the CustomResourceDefinitions that virt-operator would install,
// as the tree it is built in generates them (validation schemas included),
// one YAML file per CRD, into a directory an envtest API server installs.
// It is built inside a patched KubeVirt tree by the overlay admission suite.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

func main() {
	outDir := flag.String("out", "", "directory to write the CRD YAML files into")
	flag.Parse()
	if *outDir == "" {
		fmt.Fprintln(os.Stderr, "crds: --out is required")
		os.Exit(2)
	}
	if err := writeCRDs(*outDir); err != nil {
		fmt.Fprintf(os.Stderr, "crds: %v\n", err)
		os.Exit(1)
	}
}

func writeCRDs(outDir string) error {
	generators := []func() (*extv1.CustomResourceDefinition, error){
		components.NewVirtualMachineInstanceCrd,
		components.NewVirtualMachineCrd,
		components.NewReplicaSetCrd,
		components.NewPresetCrd,
		components.NewVirtualMachineInstanceMigrationCrd,
		components.NewKubeVirtCrd,
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	for _, generate := range generators {
		crd, err := generate()
		if err != nil {
			return fmt.Errorf("generate CRD: %w", err)
		}
		if err := writeCRD(filepath.Join(outDir, crd.Name+".yaml"), crd); err != nil {
			return err
		}
	}
	return nil
}

// writeCRD writes crd as plain YAML. tools/util.MarshallObject is not used:
// it rewrites quotes for manifest templates, which breaks schema patterns.
func writeCRD(path string, crd *extv1.CustomResourceDefinition) error {
	data, err := yaml.Marshal(crd)
	if err != nil {
		return fmt.Errorf("marshal %s: %w", crd.Name, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
