function r = bitshift(a, k, varargin)
% Octave shim: Octave 7's bitshift passes the shift count to the C++ shift operator, so a shift
% by the type's width or more is taken modulo the width (bitshift(uint64(12345), -129) is 6172,
% bitshift(uint64(12345), -64) is 12345); MATLAB shifts every bit out (0). The toolbox's
% AddTwoNonNormSums (CDNA3) shifts uint64 partial sums by exponent differences of up to 532, so
% without this shim a small C (subnormal, say) is added at a wrong position. Shifts of fewer bits
% than the width (and every other call) are Octave's builtin.
r = builtin('bitshift', a, k, varargin{:});
switch class(a)
  case {'uint64', 'int64'}, w = 64;
  case {'uint32', 'int32'}, w = 32;
  case {'uint16', 'int16'}, w = 16;
  case {'uint8', 'int8'}, w = 8;
  otherwise, w = 53;
end
out = abs(double(k)) >= w;
if any(out(:))
  if isscalar(k)
    r(:) = 0;
  else
    r(out) = 0;
  end
end
end
