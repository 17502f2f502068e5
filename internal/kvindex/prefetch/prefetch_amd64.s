#include "textflag.h"

// func Line(p unsafe.Pointer)
TEXT ·Line(SB), NOSPLIT, $0-8
	MOVQ	p+0(FP), AX
	PREFETCHT0	(AX)
	RET

// func Addrs(a []uintptr)
TEXT ·Addrs(SB), NOSPLIT, $0-24
	MOVQ	a_base+0(FP), SI
	MOVQ	a_len+8(FP), CX
	TESTQ	CX, CX
	JEQ	done
loop:
	MOVQ	(SI), AX
	PREFETCHT0	(AX)
	ADDQ	$8, SI
	DECQ	CX
	JNE	loop
done:
	RET
