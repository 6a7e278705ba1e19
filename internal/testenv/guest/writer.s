# Test guest: a BIOS boot sector that writes a known pattern to the disk it
# booted from and reports on COM1.
#
# The test environment patches the parameter block (found by its magic) before
# the sector goes into an image. Sector contents, all little endian:
#   bytes  0..7   the sector's LBA
#   bytes  8..11  the seed
#   bytes 12..511 dword i (3..127) = (LBA low 32 bits XOR seed) + i * 0x9E3779B9
# Serial lines: "START <lba> <sectors> <seed>", "PROGRESS <written>" every
# N calls, then "DONE <written>" or "ERR <INT 13h status>"; all numbers hex.
# Built with: as --32, ld -m elf_i386 -Ttext 0x7c00 --oformat binary.

	.code16
	.set COM1, 0x3f8
	.set BUFSEG, 0x1000		# 64 KiB buffer segment, 127 sectors fit
	.set GOLDEN, 0x9e3779b9

	.text
	.globl _start
_start:
	cli
	xorw %ax, %ax
	movw %ax, %ds
	movw %ax, %ss
	movw $0x7c00, %sp
	ljmp $0, $main			# some BIOSes enter at 07c0:0000

main:
	sti
	cld
	movb %dl, drive
	movw p_progress, %ax
	movw %ax, calls_left
	movw $msg_start, %si
	call puts
	movl p_lba, %edx
	call space_hex8
	movl p_count, %edx
	call space_hex8
	movl p_seed, %edx
	call space_hex8
	call crlf

next_call:
	movl p_count, %ecx
	testl %ecx, %ecx
	jz done
	movzwl p_per_call, %eax
	cmpl %eax, %ecx
	jbe 1f
	movl %eax, %ecx
1:	movw %cx, dap_count
	movl p_lba, %ebx
	movl %ebx, dap_lba
	movl p_lba+4, %ebp
	movl %ebp, dap_lba+4

	# Fill the buffer: %ebx:%ebp is the running LBA, %cx the sectors left.
	movw $BUFSEG, %ax
	movw %ax, %es
	xorw %di, %di
fill_sector:
	movl %ebx, %eax
	stosl
	movl %ebp, %eax
	stosl
	movl p_seed, %eax
	stosl
	xorl %ebx, %eax
	addl $(3 * GOLDEN), %eax
	movw $125, %si
2:	stosl
	addl $GOLDEN, %eax
	decw %si
	jnz 2b
	addl $1, %ebx
	adcl $0, %ebp
	loop fill_sector

	movw $dap, %si
	movb drive, %dl
	movw $0x4300, %ax
	int $0x13
	jc io_error

	movzwl dap_count, %eax
	addl %eax, written
	subl %eax, p_count
	addl %eax, p_lba
	adcl $0, p_lba+4

	movw p_progress, %cx
	jcxz delay
	decw calls_left
	jnz delay
	movw %cx, calls_left
	movw $msg_progress, %si
	call puts
	movl written, %edx
	call space_hex8
	call crlf

delay:
	movw p_delay, %dx
	movw p_delay+2, %cx
	movw %cx, %ax
	orw %dx, %ax
	jz next_call
	movb $0x86, %ah
	int $0x15
	jmp next_call

done:
	movw $msg_done, %si
	call puts
	movl written, %edx
	call space_hex8
	jmp finish

io_error:
	movzbl %ah, %edx
	shll $24, %edx
	movw $msg_err, %si
	call puts
	movb $' ', %al
	call putc
	movw $2, %cx
	call hex
finish:
	call crlf
halt:
	cli
	hlt
	jmp halt

# space_hex8 prints a blank and %edx as 8 hex digits.
space_hex8:
	movb $' ', %al
	call putc
	movw $8, %cx
# hex prints the top %cx nibbles of %edx, most significant first.
hex:
	roll $4, %edx
	movb %dl, %al
	andb $0x0f, %al
	addb $'0', %al
	cmpb $'9', %al
	jbe 3f
	addb $('a' - '0' - 10), %al
3:	call putc
	loop hex
	ret

crlf:
	movw $msg_crlf, %si
# puts prints the NUL-terminated string at %si.
puts:
	lodsb
	testb %al, %al
	jz 4f
	call putc
	jmp puts
4:	ret

# putc sends %al to COM1 once its transmitter holding register is empty.
putc:
	pushw %dx
	pushw %ax
	movw $(COM1 + 5), %dx
5:	inb %dx, %al
	testb $0x20, %al
	jz 5b
	popw %ax
	movw $COM1, %dx
	outb %al, %dx
	popw %dx
	ret

msg_start:	.asciz "START"
msg_progress:	.asciz "PROGRESS"
msg_done:	.asciz "DONE"
msg_err:	.asciz "ERR"
msg_crlf:	.asciz "\r\n"

drive:		.byte 0
written:	.long 0
calls_left:	.word 0

	.balign 4
dap:
	.byte 16, 0
dap_count:	.word 0
	.word 0, BUFSEG		# buffer offset, segment
dap_lba:	.quad 0

# Parameter block, patched by testenv (layout in guest.go).
	.org 0x1e0
	.ascii "KQGW"
p_lba:		.quad 1		# first LBA to write, >= 1
p_count:	.long 0		# sectors to write
p_per_call:	.word 127	# sectors per INT 13h call, 1..127
p_progress:	.word 0		# calls between PROGRESS lines, 0 for none
p_delay:	.long 0		# microseconds to wait after each call
p_seed:		.long 0

	.org 510
	.byte 0x55, 0xaa
