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

package overlaydemo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/hack/demo/barchart"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

// Files in the output directory.
const (
	UsageTable = "disk-usage.txt"
	UsageChart = "disk-usage.png"
)

// moments names the tables in the order measure takes them.
var moments = []string{"after the first boot", "after the restart"}

// diskUsage is one row of the table.
type diskUsage struct {
	disk, kind, format string
	virtual            int64 // qemu-img info's virtual size
	allocated          int64 // blocks the file holds on the host (stat)
}

// usageOf measures one image; an overlay is opened alone, its header names
// its backing as the compute container has it.
func usageOf(ctx context.Context, disk, kind, path, format string) (diskUsage, error) {
	info, err := qcow2.Tool{}.Info(ctx, path, qcow2.InfoOptions{Format: format, NoBacking: format == qcow2.FormatQcow2})
	if err != nil {
		return diskUsage{}, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return diskUsage{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return diskUsage{disk: disk, kind: kind, format: format, virtual: info.VirtualSize, allocated: st.Blocks * 512}, nil
}

// measure prints the disk usage table of this moment and appends it to the
// table file.
func (d *demo) measure(ctx context.Context) error {
	golden, err := usageOf(ctx, "golden", "backing", d.golden, qcow2.FormatRaw)
	if err != nil {
		return err
	}
	rows := []diskUsage{golden}
	for _, v := range d.vms {
		row, err := usageOf(ctx, v.name, v.kind(), v.overlay, qcow2.FormatQcow2)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	table, err := usageTable(moments[len(d.usage)], rows)
	if err != nil {
		return err
	}
	d.usage = append(d.usage, rows)

	d.say("measured the disks (qemu-img info, stat):")
	fmt.Fprint(d.Log, table)
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if len(d.usage) == 1 {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(filepath.Join(d.OutDir, UsageTable), flags, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(table); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// usageTable formats the rows of one moment, the golden image's first,
// and compares the overlays with full copies of the golden image.
func usageTable(moment string, rows []diskUsage) (string, error) {
	var table strings.Builder
	fmt.Fprintf(&table, "disk usage %s:\n", moment)
	w := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "    disk\tkind\tformat\tvirtual size\tallocated\tallocated bytes")
	var overlays int64
	for i, r := range rows {
		fmt.Fprintf(w, "    %s\t%s\t%s\t%s\t%.1f MiB\t%d\n", r.disk, r.kind, r.format, sizeMiB(r.virtual), float64(r.allocated)/mib, r.allocated)
		if i > 0 {
			overlays += r.allocated
		}
	}
	if err := w.Flush(); err != nil {
		return "", err
	}
	copies := len(rows) - 1
	fmt.Fprintf(&table, "    the %d overlays together: %.1f MiB; %d full copies of the golden image: %.1f MiB\n",
		copies, float64(overlays)/mib, copies, float64(copies)*float64(rows[0].allocated)/mib)
	return table.String(), nil
}

// sizeMiB shows a virtual size in whole MiB, or in bytes when it is not.
func sizeMiB(size int64) string {
	if size%mib != 0 {
		return fmt.Sprintf("%d B", size)
	}
	return fmt.Sprintf("%d MiB", size/mib)
}

// chart draws the allocated bytes of every disk at every moment measured.
func (d *demo) chart(context.Context) error {
	c := barchart.Chart{Title: "allocated bytes per disk"}
	for _, r := range d.usage[0] {
		c.Labels = append(c.Labels, r.disk+" ("+r.kind+")")
	}
	for i, rows := range d.usage {
		s := barchart.Series{Name: moments[i]}
		for _, r := range rows {
			s.Values = append(s.Values, r.allocated)
		}
		c.Series = append(c.Series, s)
	}
	path := filepath.Join(d.OutDir, UsageChart)
	if err := c.WritePNG(path); err != nil {
		return err
	}
	d.say("drew the allocated bytes per disk into %s", relative(path))
	return nil
}
