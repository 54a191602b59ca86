function s = string(x)
% Octave shim (Octave 7 has no string class): the toolbox's Kulisch accumulator (CDNA1) calls
% string(charMatrix) and then reads row i as s{i}; a cell array of the rows does the same.
s = cellstr(x);
end
