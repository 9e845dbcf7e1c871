; Inno Setup script: the Windows installer around PyInstaller's one-folder build.
; build.py runs: iscc /DAppVersion=X /DSourceDir=dist\Tandem /DOutputDir=dist packaging\windows\tandem.iss
#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#ifndef SourceDir
  #define SourceDir "..\..\dist\Tandem"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist"
#endif

[Setup]
AppId={{6B0E6B53-2F3A-4C3E-9C55-7A1D7E0C1D21}
AppName=Tandem
AppVersion={#AppVersion}
AppPublisher=Tandem
DefaultDirName={autopf}\Tandem
DefaultGroupName=Tandem
DisableProgramGroupPage=yes
PrivilegesRequiredOverridesAllowed=dialog
OutputDir={#OutputDir}
OutputBaseFilename=Tandem-{#AppVersion}-windows-x64-setup
SetupIconFile=..\..\resources\icons\tandem.ico
UninstallDisplayIcon={app}\tandem.exe
Compression=lzma2/max
SolidCompression=yes
; PyTorch's CUDA libraries make the app folder several GB: one setup .exe cannot hold over about
; 4.2 GB, so the data goes into Tandem-...-setup-N.bin slices beside a small setup .exe.
DiskSpanning=yes
DiskSliceSize=max
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
WizardStyle=modern

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: recursesubdirs createallsubdirs ignoreversion

[Icons]
Name: "{group}\Tandem"; Filename: "{app}\tandem.exe"
Name: "{group}\Uninstall Tandem"; Filename: "{uninstallexe}"
Name: "{autodesktop}\Tandem"; Filename: "{app}\tandem.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "Create a desktop icon"; Flags: unchecked

[Run]
Filename: "{app}\tandem.exe"; Description: "Start Tandem"; Flags: nowait postinstall skipifsilent
