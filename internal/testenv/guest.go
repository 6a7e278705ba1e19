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

package testenv

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// SectorSize is the size of the sectors the test guest writes.
const SectorSize = 512

// MaxSectorsPerCall is the most sectors one INT 13h extended write moves.
const MaxSectorsPerCall = 127

//go:embed guest/writer.s
var guestSource []byte

// paramMagic precedes the parameter block in the boot sector; the layout
// after it is GuestParams in declaration order, little endian.
var paramMagic = []byte("KQGW")

const goldenRatio32 = 0x9e3779b9

// GuestParams tells the test guest what to write. The zero value of
// SectorsPerCall means MaxSectorsPerCall.
type GuestParams struct {
	// StartLBA is the first sector written; at least 1, sector 0 holds the
	// guest itself.
	StartLBA uint64
	// Sectors is how many sectors the guest writes.
	Sectors uint32
	// SectorsPerCall is how many sectors one INT 13h call writes (1..127).
	SectorsPerCall uint16
	// ProgressEvery is the number of calls between PROGRESS lines, 0 for
	// none.
	ProgressEvery uint16
	// DelayMicros is how long the guest waits after each call, so tests can
	// drive slow write rates.
	DelayMicros uint32
	// Seed varies the pattern so runs over the same sectors differ.
	Seed uint32
}

func (p GuestParams) validate() error {
	if p.StartLBA < 1 {
		return errors.New("guest start LBA must be at least 1: sector 0 holds the guest")
	}
	if p.SectorsPerCall > MaxSectorsPerCall {
		return fmt.Errorf("guest sectors per call %d exceeds %d", p.SectorsPerCall, MaxSectorsPerCall)
	}
	return nil
}

var guestBuild struct {
	sync.Mutex
	sector []byte
}

// GuestBootSector assembles and links the test guest once per test binary
// and returns a copy of its unpatched 512-byte boot sector.
func GuestBootSector(ctx context.Context) ([]byte, error) {
	guestBuild.Lock()
	defer guestBuild.Unlock()
	if guestBuild.sector == nil {
		sector, err := assembleGuest(ctx)
		if err != nil {
			return nil, err
		}
		guestBuild.sector = sector
	}
	return bytes.Clone(guestBuild.sector), nil
}

func assembleGuest(ctx context.Context) ([]byte, error) {
	dir, err := os.MkdirTemp("", "guest-")
	if err != nil {
		return nil, fmt.Errorf("build test guest: %w", err)
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "writer.s")
	obj := filepath.Join(dir, "writer.o")
	bin := filepath.Join(dir, "writer.bin")
	if err := os.WriteFile(src, guestSource, 0o644); err != nil {
		return nil, fmt.Errorf("build test guest: %w", err)
	}
	if _, err := run(ctx, "as", "--32", "-o", obj, src); err != nil {
		return nil, fmt.Errorf("assemble test guest: %w", err)
	}
	if _, err := run(ctx, "ld", "-m", "elf_i386", "-Ttext", "0x7c00", "--oformat", "binary", "-o", bin, obj); err != nil {
		return nil, fmt.Errorf("link test guest: %w", err)
	}
	sector, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("build test guest: %w", err)
	}
	if len(sector) != SectorSize || sector[510] != 0x55 || sector[511] != 0xaa {
		return nil, fmt.Errorf("test guest is %d bytes without a boot signature, want one %d-byte boot sector", len(sector), SectorSize)
	}
	if bytes.Count(sector, paramMagic) != 1 {
		return nil, fmt.Errorf("test guest has no unique parameter block %q", paramMagic)
	}
	return sector, nil
}

// BootSector returns the test guest with these parameters patched in.
func (p GuestParams) BootSector(ctx context.Context) ([]byte, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	sector, err := GuestBootSector(ctx)
	if err != nil {
		return nil, err
	}
	perCall := p.SectorsPerCall
	if perCall == 0 {
		perCall = MaxSectorsPerCall
	}
	block := sector[bytes.Index(sector, paramMagic)+len(paramMagic):]
	le := binary.LittleEndian
	le.PutUint64(block[0:], p.StartLBA)
	le.PutUint32(block[8:], p.Sectors)
	le.PutUint16(block[12:], perCall)
	le.PutUint16(block[14:], p.ProgressEvery)
	le.PutUint32(block[16:], p.DelayMicros)
	le.PutUint32(block[20:], p.Seed)
	return sector, nil
}

// GuestSector is what the test guest writes into sector lba with seed.
func GuestSector(lba uint64, seed uint32) []byte {
	sector := make([]byte, SectorSize)
	le := binary.LittleEndian
	le.PutUint64(sector[0:], lba)
	le.PutUint32(sector[8:], seed)
	v := uint32(lba) ^ seed
	for i := uint32(3); i < SectorSize/4; i++ {
		le.PutUint32(sector[4*i:], v+i*goldenRatio32)
	}
	return sector
}

// VerifyGuestData checks that data, read from the disk starting at sector
// firstLBA, holds what the test guest writes with seed; the error names the
// first sector that differs.
func VerifyGuestData(data []byte, firstLBA uint64, seed uint32) error {
	if len(data)%SectorSize != 0 {
		return fmt.Errorf("guest data is %d bytes, not whole sectors", len(data))
	}
	for off := 0; off < len(data); off += SectorSize {
		lba := firstLBA + uint64(off/SectorSize)
		got := data[off : off+SectorSize]
		if want := GuestSector(lba, seed); !bytes.Equal(got, want) {
			return fmt.Errorf("sector %d does not hold the guest pattern for seed %#x: starts % x, want % x", lba, seed, got[:16], want[:16])
		}
	}
	return nil
}

// GuestStatus is what the test guest reported on its serial console.
type GuestStatus struct {
	Started bool
	// Written is the number of sectors the last PROGRESS or DONE line
	// reported.
	Written uint32
	Done    bool
	// Err is the INT 13h status of a failed write; Failed tells whether
	// there was one.
	Failed bool
	Err    uint8
}

// Finished reports whether the guest stopped writing, done or failed.
func (s GuestStatus) Finished() bool {
	return s.Done || s.Failed
}

var guestLine = regexp.MustCompile(`(?m)^(START|PROGRESS|DONE|ERR) ?([0-9a-f]*)`)

// ParseGuestStatus reads the test guest's serial output; output read from
// a log the guest may still be writing is cut to WholeLines first.
func ParseGuestStatus(serial string) GuestStatus {
	var s GuestStatus
	for _, m := range guestLine.FindAllStringSubmatch(serial, -1) {
		n, _ := strconv.ParseUint(m[2], 16, 32)
		switch m[1] {
		case "START":
			s.Started = true
		case "PROGRESS":
			s.Written = uint32(n)
		case "DONE":
			s.Done = true
			s.Written = uint32(n)
		case "ERR":
			s.Failed = true
			s.Err = uint8(n)
		}
	}
	return s
}

// WholeLines is the part of serial output read while it was being written
// that ends with a line's end. The guest writes a line's word, its numbers
// and its end in separate steps, so a reader of the log may see "DONE"
// before the count that follows it.
func WholeLines(serial string) string {
	return serial[:strings.LastIndex(serial, "\n")+1]
}
