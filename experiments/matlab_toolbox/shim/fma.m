function d = fma(a, b, c)
% Octave shim (Octave 7 has no fma): MATLAB's fma(a, b, c) = a*b + c rounded once, in single if
% any argument is single. The toolbox calls it only as fma(x, 1, y) (CDNA2 pairwise sums), so this
% is x + y rounded once: single(double(x) + double(y)) is correctly rounded for binary32 operands
% (double rounding through binary64 is innocuous for + since 53 >= 2*24 + 2).
if any(b(:) ~= 1)
  error('fma shim: only fma(x, 1, y) is implemented');
end
if isa(a, 'single') || isa(b, 'single') || isa(c, 'single')
  d = single(double(a) + double(c));
else
  d = a + c;
end
end
